package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// annotationOutput marks commands that list or create something; they all
// take -o json (a meta-test holds every such command to it).
const annotationOutput = "aenv/output"

// outputFlag is -o/--output: "table" (or "text") for people, "json" for
// programs.
type outputFlag struct{ format string }

func addOutputFlag(cmd *cobra.Command, o *outputFlag) {
	cmd.Flags().StringVarP(&o.format, "output", "o", "table", "output format: table or json")
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[annotationOutput] = "true"
}

// json reports whether JSON was asked for, rejecting unknown formats.
func (o outputFlag) json() (bool, error) {
	switch o.format {
	case "json":
		return true, nil
	case "table", "text", "":
		return false, nil
	}
	return false, usageError{fmt.Errorf("unknown output format %q (table or json)", o.format)}
}

// writeJSON prints v indented, as the one value on stdout.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// raws makes a JSON array of the items as the server sent them, never
// null.
func raws[T any](items []T, raw func(T) json.RawMessage) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(items))
	for _, item := range items {
		out = append(out, raw(item))
	}
	return out
}

// table writes aligned columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, headers ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	t.row(headers...)
	return t
}

func (t *table) row(cells ...string) { fmt.Fprintln(t.tw, strings.Join(cells, "\t")) }

func (t *table) flush() error { return t.tw.Flush() }

// humanDuration prints d coarsely: 45s, 12m, 3h, 5d.
func humanDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// age is how long ago t was, "-" when unknown.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return humanDuration(max(now.Sub(t), 0))
}

// deadline is how long until t, e.g. "in 4m", or "expired".
func deadline(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	if !t.After(now) {
		return "expired"
	}
	return "in " + humanDuration(t.Sub(now))
}

// humanBytes prints n in binary units.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// shortDigest trims "sha256:" and keeps 12 hex digits, as docker does.
func shortDigest(d string) string {
	_, hex, ok := strings.Cut(d, ":")
	if !ok {
		hex = d
	}
	if len(hex) > 12 {
		hex = hex[:12]
	}
	return hex
}
