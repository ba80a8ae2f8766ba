// Package build runs template builds the way E2B's SDK describes them: a
// base (an image or a template), a list of steps (run, copy, env, workdir,
// user) and an optional start command with its ready check. A build runs
// its steps inside a sandbox made from the base and ends by snapshotting
// it into a template named after the build.
package build

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"strings"

	"github.com/aenv-dev/aenv/internal/template"
)

// Spec is E2B's TemplateBuildStartV2: what POST
// /v2/templates/{id}/builds/{buildID} carries.
type Spec struct {
	FromImage    string `json:"fromImage,omitempty"`
	FromTemplate string `json:"fromTemplate,omitempty"`
	// FromImageRegistry holds registry credentials; private registries
	// are not supported yet, so a build that sets it is refused.
	FromImageRegistry json.RawMessage `json:"fromImageRegistry,omitempty"`
	StartCmd          string          `json:"startCmd,omitempty"`
	ReadyCmd          string          `json:"readyCmd,omitempty"`
	Force             bool            `json:"force,omitempty"`
	Steps             []Step          `json:"steps,omitempty"`
}

// Step is E2B's TemplateStep.
type Step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args,omitempty"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force,omitempty"`
}

// Step types the SDK sends.
const (
	StepRun     = "RUN"
	StepCopy    = "COPY"
	StepEnv     = "ENV"
	StepWorkdir = "WORKDIR"
	StepUser    = "USER"
)

// e2bBaseImage is the image E2B's SDK names for fromBaseImage() and for a
// template that names no base; aenv's own base template stands in for it,
// so such builds need no registry.
const e2bBaseImage = "e2bdev/base"

// maxSteps bounds a build's length.
const maxSteps = 512

// Base is where a build starts: a template by name, or an image to pull
// into a template first.
type Base struct {
	Template string // aenv template name or ID; set unless Image is
	Image    string // OCI reference
}

// Validate checks a spec and says where it starts.
func (s *Spec) Validate() (Base, error) {
	var base Base
	switch {
	case s.FromImage != "" && s.FromTemplate != "":
		return base, fmt.Errorf("exactly one of fromImage and fromTemplate may be given")
	case s.FromTemplate != "":
		if err := template.CheckName(s.FromTemplate); err != nil {
			return base, fmt.Errorf("fromTemplate: %w", err)
		}
		base.Template = s.FromTemplate
	case s.FromImage == "" || isE2BBase(s.FromImage):
		base.Template = template.BaseName
	default:
		if len(s.FromImageRegistry) > 0 && string(s.FromImageRegistry) != "null" {
			return base, fmt.Errorf("fromImageRegistry: registry credentials are not supported")
		}
		base.Image = s.FromImage
	}
	if len(s.Steps) > maxSteps {
		return base, fmt.Errorf("at most %d steps are allowed", maxSteps)
	}
	for i, st := range s.Steps {
		if err := st.validate(); err != nil {
			return base, fmt.Errorf("step %d (%s): %w", i+1, st.Type, err)
		}
	}
	return base, nil
}

// isE2BBase reports whether ref names E2B's base image, in any spelling.
func isE2BBase(ref string) bool {
	ref = strings.TrimPrefix(ref, "docker.io/")
	ref = strings.TrimPrefix(ref, "index.docker.io/")
	name, tag, _ := strings.Cut(ref, ":")
	return name == e2bBaseImage && (tag == "" || tag == "latest")
}

func (st Step) validate() error {
	n := len(st.Args)
	switch st.Type {
	case StepRun:
		if n < 1 || n > 2 || strings.TrimSpace(st.Args[0]) == "" {
			return fmt.Errorf("wants a command and optionally a user")
		}
	case StepCopy:
		if n < 2 || n > 4 || st.Args[0] == "" || st.Args[1] == "" {
			return fmt.Errorf("wants a source, a destination, and optionally a user and a mode")
		}
		if !validHash(st.FilesHash) {
			return fmt.Errorf("filesHash must be 64 hex digits")
		}
		if path.IsAbs(st.Args[0]) || hasDotDot(st.Args[0]) {
			return fmt.Errorf("source %q must be relative and stay inside the context", st.Args[0])
		}
		if n == 4 && st.Args[3] != "" && !isOctalMode(st.Args[3]) {
			return fmt.Errorf("mode %q must be octal", st.Args[3])
		}
	case StepEnv:
		if n == 0 || n%2 != 0 {
			return fmt.Errorf("wants name/value pairs")
		}
		for i := 0; i < n; i += 2 {
			if st.Args[i] == "" || strings.ContainsAny(st.Args[i], "=\x00") {
				return fmt.Errorf("invalid variable name %q", st.Args[i])
			}
		}
	case StepWorkdir, StepUser:
		if n != 1 || st.Args[0] == "" {
			return fmt.Errorf("wants one argument")
		}
	default:
		return fmt.Errorf("unsupported step type")
	}
	return nil
}

func hasDotDot(p string) bool {
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." {
			return true
		}
	}
	return false
}

func isOctalMode(s string) bool {
	if len(s) == 0 || len(s) > 4 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '7' {
			return false
		}
	}
	return true
}

// validHash accepts a lower-case SHA-256 hex digest (what the SDK sends
// as filesHash; uploads are stored under it).
func validHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}

// Keys are the cache keys of a build: one per step, each a digest of the
// previous one and the step's definition (its files by their hash), and
// a final one that adds the start and ready commands. parent identifies
// the base (its template ID), so a rebuilt base changes every key.
func (s *Spec) Keys(parent string) (steps []string, final string) {
	key := digest("base", parent)
	for _, st := range s.Steps {
		key = digest(append([]string{"step", key, st.Type, st.FilesHash}, st.Args...)...)
		steps = append(steps, key)
	}
	return steps, digest("final", key, s.StartCmd, s.ReadyCmd)
}

// digest hashes parts unambiguously (each is length-prefixed).
func digest(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Forced reports whether the build, or any step of it, asks to skip the
// cache.
func (s *Spec) Forced() bool {
	if s.Force {
		return true
	}
	for _, st := range s.Steps {
		if st.Force {
			return true
		}
	}
	return false
}

// Describe is a step as the build log shows it.
func (st Step) Describe() string {
	switch st.Type {
	case StepRun:
		d := "RUN " + st.Args[0]
		if len(st.Args) > 1 && st.Args[1] != "" {
			d += " (as " + st.Args[1] + ")"
		}
		return d
	case StepEnv:
		var kv []string
		for i := 0; i+1 < len(st.Args); i += 2 {
			kv = append(kv, st.Args[i]+"="+st.Args[i+1])
		}
		return "ENV " + strings.Join(kv, " ")
	}
	return st.Type + " " + strings.Join(nonEmpty(st.Args), " ")
}

func nonEmpty(s []string) []string {
	var out []string
	for _, v := range s {
		if v != "" {
			out = append(out, v)
		}
	}
	return out
}

// ImageTemplateName is the name of the template an image base is pulled
// into; later builds from the same image reuse it.
// imageTemplatePrefix starts the names of pulled images' templates.
const imageTemplatePrefix = "image."

func ImageTemplateName(ref string) string {
	name := imageTemplatePrefix + strings.NewReplacer("/", "_", "@", "_").Replace(ref)
	if len(name) > 128 || template.CheckName(name) != nil {
		return imageTemplatePrefix + digest(ref)[:32]
	}
	return name
}
