package main

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	report, err := os.ReadFile("../../docs/bench.json")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tests := []struct {
		name    string
		args    []string
		stdin   string
		code    int
		wantPNG bool
	}{
		{"report from stdin", []string{"-", filepath.Join(dir, "a.png")}, string(report), 0, true},
		{"report from a file", []string{"../../docs/bench.json", filepath.Join(dir, "b.png")}, "", 0, true},
		{"not JSON", []string{"-", filepath.Join(dir, "c.png")}, "nope", 1, false},
		{"usage", []string{"-"}, "", 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := run(tt.args, strings.NewReader(tt.stdin), &stderr); code != tt.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, tt.code, stderr.String())
			}
			if len(tt.args) < 2 {
				return
			}
			f, err := os.Open(tt.args[1])
			if !tt.wantPNG {
				if err == nil {
					f.Close()
					t.Fatalf("a failed draw left %s", tt.args[1])
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := png.Decode(f); err != nil {
				t.Fatalf("not a PNG: %v", err)
			}
		})
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
