// Command aenv-chart draws the latency chart of an `aenv bench` report:
//
//	aenv-chart REPORT.json OUT.png    (REPORT.json may be - for stdin)
//
// `aenv bench --chart` runs it. It is a binary of its own so that the
// plotting library stays out of aenv, which is also the server.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/aenv-dev/aenv/internal/bench"
	"github.com/aenv-dev/aenv/internal/bench/chart"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stderr))
}

func run(args []string, stdin io.Reader, stderr io.Writer) int {
	if len(args) != 2 {
		fmt.Fprintln(stderr, "usage: aenv-chart REPORT.json|- OUT.png")
		return 2
	}
	if err := draw(args[0], args[1], stdin); err != nil {
		fmt.Fprintln(stderr, "aenv-chart:", err)
		return 1
	}
	return 0
}

func draw(reportPath, outPath string, stdin io.Reader) error {
	in := stdin
	if reportPath != "-" {
		f, err := os.Open(reportPath)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	var report bench.Report
	if err := json.NewDecoder(in).Decode(&report); err != nil {
		return fmt.Errorf("read report %s: %w", reportPath, err)
	}
	// Write next to the target and rename: a failed draw leaves no
	// half-written PNG.
	tmp, err := os.CreateTemp(filepath.Dir(outPath), "."+filepath.Base(outPath)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if err := chart.Write(tmp, &report); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), outPath)
}
