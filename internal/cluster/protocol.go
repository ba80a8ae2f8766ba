package cluster

import "fmt"

// The cluster protocol is what gateways and nodes say to each other: the
// API a gateway forwards to a node, the rows of the cluster's database
// both read, and what each expects the other to do with them. Releases
// that keep it compatible keep its number, so that a rolling upgrade can
// run gateways and nodes of neighbouring releases side by side.
//
// Bump Protocol when a change would break a peer of the previous number
// (a gateway sending what an older node cannot serve, a row an older
// peer would misread). Raise MinProtocol to the oldest number this
// release still works with, and no higher than the previous release's
// Protocol, or a roll would cut the cluster in two.
//
// History:
//  1. The first recorded protocol.
//  2. Teams: a node creates a gateway's sandboxes in the team its
//     Aenv-Team header names (protocol 1 nodes ignore it).
//  3. Volumes: a node serves /volumes and /volumecontent (older nodes
//     answer them 404).
//  4. Volume moves: a node serves /volumes/{id}/export, import and files
//     (older nodes answer them 404), and takes a volume's reference only
//     while the volume is its own and not moving.
//  5. Moves keep hard links: a node's export writes a hard link as a
//     link only when asked (?links=1), which a gateway asks when the
//     importing node reads links (protocol 4 importers drop them).
//  6. Copies for forks across nodes: a node serves POST
//     /volumes/{id}/copy, forks another node's snapshot with copySources
//     (older nodes refuse both), and uploads snapshots with volumes
//     (which a gateway starts only on their own node, unless every
//     volume is copied). Nodes publish their builds under way with
//     their heartbeats.
const (
	Protocol    = 6
	MinProtocol = 1
)

// PublishedBuildsProtocol is the first protocol whose nodes publish their
// builds under way with their heartbeats.
const PublishedBuildsProtocol = 6

// PublishesBuilds reports whether a node of protocol p publishes its
// builds under way with its heartbeats (a node of an older release,
// downgraded, would leave the last ones it wrote).
func PublishesBuilds(p int) bool { return p >= PublishedBuildsProtocol }

// ForkCopiesProtocol is the first protocol whose nodes copy volumes for
// a fork's children on other nodes: a gateway spreads such a fork only
// over such nodes.
const ForkCopiesProtocol = 6

// CopiesForForks reports whether a node of protocol p takes a share of a
// fork with copies brought from another node (and makes such copies).
func CopiesForForks(p int) bool { return p >= ForkCopiesProtocol }

// HardLinksProtocol is the first protocol whose nodes read hard links in
// a volume's import (and write them in an export when asked).
const HardLinksProtocol = 5

// MovesHardLinks reports whether a node of protocol p imports hard links.
func MovesHardLinks(p int) bool { return p >= HardLinksProtocol }

// VolumeMovesProtocol is the first protocol whose nodes move volumes: a
// gateway moves volumes only between such nodes.
const VolumeMovesProtocol = 4

// MovesVolumes reports whether a node of protocol p moves volumes.
func MovesVolumes(p int) bool { return p >= VolumeMovesProtocol }

// VolumesProtocol is the first protocol whose nodes keep volumes: a
// gateway makes volumes only on such nodes.
const VolumesProtocol = 3

// SpeaksVolumes reports whether a node of protocol p keeps volumes.
func SpeaksVolumes(p int) bool { return p >= VolumesProtocol }

// TeamsProtocol is the first protocol whose nodes keep sandboxes in
// teams: a gateway places a team's sandboxes only on such nodes.
const TeamsProtocol = 2

// SpeaksTeams reports whether a node of protocol p keeps sandboxes in the
// team a gateway names.
func SpeaksTeams(p int) bool { return p >= TeamsProtocol }

// Compatible reports whether a peer speaking protocol p can work with
// this one. Nodes from before protocols were recorded speak 1 (their rows
// read 1, and a record without one, 0, is taken as theirs).
func Compatible(p int) bool {
	if p == 0 {
		p = 1
	}
	return p >= MinProtocol && p <= Protocol
}

// IncompatibleReason says why a node is not used, naming both sides'
// releases and protocols, or "" when it is compatible.
func IncompatibleReason(nodeProtocol int, nodeVersion, ownVersion string) string {
	if Compatible(nodeProtocol) {
		return ""
	}
	return fmt.Sprintf("node runs aenv %s with cluster protocol %d; this gateway (aenv %s) speaks protocols %d to %d: upgrade the older of the two",
		orUnknown(nodeVersion), nodeProtocol, orUnknown(ownVersion), MinProtocol, Protocol)
}

func orUnknown(v string) string {
	if v == "" {
		return "(unknown version)"
	}
	return v
}
