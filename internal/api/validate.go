package api

import (
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"
)

// Bounds of request fields that the store keeps or hands to every process.
// They are documented in docs/security.md; the body limit alone would let
// one request store megabytes that every list then returns.
const (
	maxMetadataBytes      = 64 << 10 // keys plus values of one sandbox
	maxMetadataKeyBytes   = 256
	maxMetadataValueBytes = 8 << 10
	maxEnvBytes           = 1 << 20   // names plus values of one request
	maxEnvEntryBytes      = 128 << 10 // Linux's limit of one environment string
	minExecTimeout        = time.Millisecond
)

// checkMetadata bounds sandbox metadata and keeps it printable text.
func checkMetadata(md map[string]string) error {
	total := 0
	for k, v := range md {
		switch {
		case k == "":
			return badRequest("metadata keys must not be empty")
		case len(k) > maxMetadataKeyBytes:
			return badRequest(fmt.Sprintf("metadata key %.32q... is longer than %d bytes", k, maxMetadataKeyBytes))
		case len(v) > maxMetadataValueBytes:
			return badRequest(fmt.Sprintf("metadata value of %q is longer than %d bytes", k, maxMetadataValueBytes))
		case !printable(k) || !utf8.ValidString(v) || strings.ContainsRune(v, 0):
			return badRequest(fmt.Sprintf("metadata %q must be UTF-8 text without control characters in the key or NUL in the value", k))
		}
		total += len(k) + len(v)
	}
	if total > maxMetadataBytes {
		return badRequest(fmt.Sprintf("metadata is %d bytes; at most %d are kept", total, maxMetadataBytes))
	}
	return nil
}

// checkEnv rejects environment variables a process environment cannot hold
// as given: a name with '=' or a control character would split into other
// variables, a NUL would cut the string.
func checkEnv(field string, env map[string]string) error {
	total := 0
	for k, v := range env {
		switch {
		case k == "":
			return badRequest(field + ": variable names must not be empty")
		case strings.ContainsRune(k, '=') || !printable(k):
			return badRequest(fmt.Sprintf("%s: variable name %q must not contain '=' or control characters", field, k))
		case strings.ContainsRune(v, 0):
			return badRequest(fmt.Sprintf("%s: value of %q must not contain NUL", field, k))
		case len(k)+len(v)+1 > maxEnvEntryBytes:
			return badRequest(fmt.Sprintf("%s: %q is longer than %d bytes", field, k, maxEnvEntryBytes))
		}
		total += len(k) + len(v) + 1
	}
	if total > maxEnvBytes {
		return badRequest(fmt.Sprintf("%s: %d bytes of environment; at most %d", field, total, maxEnvBytes))
	}
	return nil
}

// printable reports whether s is UTF-8 without control characters.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// sandboxTimeout converts a sandbox lifetime in whole seconds, refusing
// negative values and anything above max before multiplying (a huge value
// would wrap around to a short one).
func sandboxTimeout(secs int, max time.Duration) (time.Duration, error) {
	if secs < 0 {
		return 0, badRequest("timeout must not be negative")
	}
	if max > 0 && int64(secs) > int64(max/time.Second) {
		return 0, badRequest(fmt.Sprintf("timeout must be at most %d seconds", int64(max/time.Second)))
	}
	if int64(secs) > math.MaxInt64/int64(time.Second) {
		return 0, badRequest("timeout is too large")
	}
	return time.Duration(secs) * time.Second, nil
}

// execTimeout converts a command timeout in (fractional) seconds. Values
// outside [1 ms, max] are refused rather than turned into "no timeout".
func execTimeout(secs float64, max time.Duration) (time.Duration, error) {
	if math.IsNaN(secs) || secs < minExecTimeout.Seconds() || secs > max.Seconds() {
		return 0, badRequest(fmt.Sprintf("timeout must be between %g and %d seconds", minExecTimeout.Seconds(), int64(max.Seconds())))
	}
	return time.Duration(secs * float64(time.Second)), nil
}
