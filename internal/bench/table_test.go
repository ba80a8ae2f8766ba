package bench

import (
	"bytes"
	"strings"
	"testing"
)

func TestFormatValue(t *testing.T) {
	tests := []struct {
		in   float64
		want string
	}{
		{0, "0.00"},
		{1.234, "1.23"},
		{9.999, "10.00"},
		{12.34, "12.3"},
		{99.94, "99.9"},
		{123.4, "123"},
		{45678.9, "45679"},
	}
	for _, tt := range tests {
		if got := formatValue(tt.in); got != tt.want {
			t.Errorf("formatValue(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// tableReport has one figure on every system, one on aenv only, one
// whose aenv side only failed, and a failure.
func tableReport() *Report {
	rec := newRecorder()
	boot := rec.figure("cold_boot", "Cold boot", GroupSeed, UnitMs)
	for _, v := range []float64{100, 200, 300} {
		rec.add(boot, SystemAenv, v)
	}
	rec.add(boot, SystemRunsc, 100)
	rec.add(boot, SystemRunscEnvd, 160)
	rec.add(boot, SystemRunc, 400)
	rec.describe(boot, "how it is measured")
	rate := rec.figure("rollout_groups_per_min", "Groups per minute", GroupRollout, UnitPerMinute)
	rec.add(rate, SystemAenv, 12.5)
	broken := rec.figure("fork_wall", "Fork", GroupSeed, UnitMs)
	rec.fail(broken, SystemAenv, errTest("no capacity"))
	return &Report{
		Machine:  Machine{CPUs: 2, MemoryMiB: 1024, Kernel: "6.1.0", OS: "Debian", Arch: "amd64"},
		Server:   "http://127.0.0.1:8000",
		Short:    true,
		Figures:  rec.finish(),
		Failures: []string{"density: exploded"},
	}
}

func TestWriteTable(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteTable(&buf, tableReport()); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	lines := strings.Split(out, "\n")
	row := func(prefix string) []string {
		t.Helper()
		for _, l := range lines {
			if strings.HasPrefix(strings.TrimSpace(l), prefix) {
				return strings.Fields(l)
			}
		}
		t.Fatalf("no line starting with %q in:\n%s", prefix, out)
		return nil
	}
	tests := []struct {
		name   string
		prefix string
		want   []string
	}{
		{"header", "FIGURE", []string{"FIGURE", "SYSTEM", "N", "AVG", "P50", "P99", "MIN", "MAX", "UNIT", "ERRORS", "AENV/RUNSC", "AENV/RUNSC-ENVD", "AENV/RUNC"}},
		{"aenv row with ratios of p50s", "Cold boot", []string{"Cold", "boot", "aenv", "3", "200", "200", "298", "100", "300", "ms", "0", "2.00x", "1.25x", "0.50x"}},
		{"raw row without ratios", "runsc", []string{"runsc", "1", "100", "100", "100", "100", "100", "ms", "0"}},
		{"runsc running envd", "runsc-envd", []string{"runsc-envd", "1", "160", "160", "160", "160", "160", "ms", "0"}},
		{"third raw row", "runc", []string{"runc", "1", "400", "400", "400", "400", "400", "ms", "0"}},
		{"aenv-only figure", "Groups per minute", []string{"Groups", "per", "minute", "aenv", "1", "12.5", "12.5", "12.5", "12.5", "12.5", "/min", "0"}},
		{"failed figure shows dashes", "Fork", []string{"Fork", "aenv", "0", "-", "-", "-", "-", "-", "ms", "1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := row(tt.prefix); strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("row %q\n got %v\nwant %v", tt.prefix, got, tt.want)
			}
		})
	}
	for _, want := range []string{
		"aenv bench (short) against http://127.0.0.1:8000: 2 CPUs, 1024 MiB, Linux 6.1.0",
		"Cold boot: how it is measured",
		"Fork on aenv, first error: no capacity",
		"Failures:\n  density: exploded",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestWriteTableAlignsColumns(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteTable(&buf, tableReport()); err != nil {
		t.Fatal(err)
	}
	var header, runsc string
	for _, l := range strings.Split(buf.String(), "\n") {
		switch {
		case strings.HasPrefix(l, "FIGURE"):
			header = l
		case strings.Contains(l, " runsc "):
			runsc = l
		}
	}
	if strings.Index(header, "SYSTEM") != strings.Index(runsc, "runsc") {
		t.Errorf("SYSTEM column not aligned:\n%s\n%s", header, runsc)
	}
}
