package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// tableSystems is the row order of each figure: aenv, then the raw runtimes.
var tableSystems = append([]string{SystemAenv}, rawSystems[:]...)

// Systems lists the systems in the order reports show them.
func Systems() []string { return slices.Clone(tableSystems) }

// WriteTable prints the report for people: the machine, then one row per
// figure and system with avg/p50/p99/min/max, the error count and, on
// aenv's row, its p50 divided by each raw runtime's.
func WriteTable(w io.Writer, r *Report) error {
	m := r.Machine
	mode := "full"
	if r.Short {
		mode = "short"
	}
	fmt.Fprintf(w, "aenv bench (%s) against %s: %d CPUs, %d MiB, Linux %s, %s, %s; %.0f s\n\n",
		mode, r.Server, m.CPUs, m.MemoryMiB, m.Kernel, m.OS, m.Arch, r.Seconds)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := []string{"FIGURE", "SYSTEM", "N", "AVG", "P50", "P99", "MIN", "MAX", "UNIT", "ERRORS"}
	for _, raw := range rawSystems {
		header = append(header, "AENV/"+strings.ToUpper(raw))
	}
	fmt.Fprintln(tw, strings.Join(header, "\t")+"\t")
	group := ""
	for _, f := range r.Figures {
		if f.Group != group && group != "" {
			fmt.Fprintln(tw, strings.Repeat("\t", len(header)))
		}
		group = f.Group
		first := true
		for _, sys := range tableSystems {
			res, ok := f.Results[sys]
			if !ok {
				continue
			}
			title := ""
			if first {
				title = f.Title
			}
			fmt.Fprintln(tw, strings.Join(tableRow(f, sys, res, title), "\t")+"\t")
			first = false
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeTableNotes(w, r)
}

// tableRow is one system's row of a figure.
func tableRow(f *Figure, sys string, res *Result, title string) []string {
	row := []string{title, sys, fmt.Sprint(res.N)}
	if res.N == 0 {
		row = append(row, "-", "-", "-", "-", "-")
	} else {
		for _, v := range []float64{res.Avg, res.P50, res.P99, res.Min, res.Max} {
			row = append(row, formatValue(v))
		}
	}
	row = append(row, f.Unit, fmt.Sprint(res.Errors))
	for _, other := range rawSystems {
		q, ok := f.Ratios[other]
		if sys != SystemAenv || !ok {
			row = append(row, "")
			continue
		}
		row = append(row, fmt.Sprintf("%.2fx", q))
	}
	return row
}

// formatValue keeps about three significant digits.
func formatValue(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// writeTableNotes lists how figures were measured, first errors and
// failures.
func writeTableNotes(w io.Writer, r *Report) error {
	var lines []string
	for _, f := range r.Figures {
		if f.Note != "" {
			lines = append(lines, fmt.Sprintf("  %s: %s", f.Title, f.Note))
		}
		for _, sys := range tableSystems {
			if res, ok := f.Results[sys]; ok && res.FirstError != "" {
				lines = append(lines, fmt.Sprintf("  %s on %s, first error: %s", f.Title, sys, res.FirstError))
			}
		}
	}
	if len(lines) > 0 {
		fmt.Fprintln(w, "\nNotes (ratios divide p50s):")
		fmt.Fprintln(w, strings.Join(lines, "\n"))
	}
	if len(r.Failures) > 0 {
		fmt.Fprintln(w, "\nFailures:")
		for _, f := range r.Failures {
			fmt.Fprintln(w, "  "+f)
		}
	}
	return nil
}
