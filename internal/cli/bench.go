package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/aenv-dev/aenv/internal/bench"
)

// benchFlags are the knobs of `aenv bench`; one left unset takes the full
// or --short default.
type benchFlags struct {
	server   serverFlags
	output   string
	jsonOut  string
	chart    string
	short    bool
	only     []string
	cfg      bench.Config
	duration time.Duration
}

func (a *app) benchCommand() *cobra.Command {
	return a.benchCommandWith(&benchFlags{})
}

// benchCommandWith parses into f, which tests read.
func (a *app) benchCommandWith(f *benchFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure a local server next to raw runsc and runc",
		Long: `Measure the aenv server on this machine and print a table with avg, p50, p99,
min and max of each figure: the seed's set (cold boot, snapshot boot, pause,
resume, snapshot create, fork), exec round trip and time to first output byte,
file write+read, concurrency, density and an RL rollout loop. The same
operations are done directly with runsc and runc on the base template's rootfs
in the same run, and aenv's p50 divided by theirs is printed beside each figure.

The run is bounded in count and time and deletes every sandbox, snapshot,
template and container it made, also when interrupted. It needs root for the
raw runtimes (or --skip-raw). --short is a quick run that proves it all works.
Groups for --only: ` + strings.Join(bench.Groups(), ", ") + ".",
		Example: `  aenv bench --short
  aenv bench -o json --chart bench.png
  aenv bench --only seed,rollout --skip-raw --iterations 10`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runBench(cmd, f)
		},
	}
	addServerFlags(cmd, &f.server)
	fl := cmd.Flags()
	fl.StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	fl.StringVar(&f.jsonOut, "json-out", "", "also write the JSON report to this file")
	fl.StringVar(&f.chart, "chart", "", "write a PNG of the latency distributions to this file (drawn by aenv-chart, which make build puts next to aenv)")
	fl.BoolVar(&f.short, "short", false, "tiny counts: a quick end-to-end check, not a measurement")
	fl.StringSliceVar(&f.only, "only", nil, "run only these groups (comma-separated)")
	fl.BoolVar(&f.cfg.SkipRaw, "skip-raw", false, "measure aenv only, not runsc and runc")
	registerBenchSizes(fl, f)
	return cmd
}

// registerBenchSizes adds the count, size and path flags. Their defaults
// show the full run's values; --short lowers those not given.
func registerBenchSizes(fl *pflag.FlagSet, f *benchFlags) {
	d := bench.DefaultConfig(false)
	fl.IntVar(&f.cfg.Iterations, "iterations", d.Iterations, "samples of each latency figure")
	fl.StringVar(&f.cfg.Template, "template", d.Template, "template cold boots create from")
	fl.IntVar(&f.cfg.MemoryMB, "memory-mb", d.MemoryMB, "memory of each sandbox and raw container")
	fl.IntVar(&f.cfg.ForkCount, "fork-count", d.ForkCount, "children per fork")
	fl.IntVar(&f.cfg.ForkIterations, "fork-iterations", d.ForkIterations, "forks to time")
	fl.IntVar(&f.cfg.ConcurrentCreates, "concurrent-creates", d.ConcurrentCreates, "creates started at once")
	fl.IntVar(&f.cfg.SustainedSecs, "sustained-secs", d.SustainedSecs, "length of the sustained create/delete loop")
	fl.IntVar(&f.cfg.SustainedLevel, "sustained-level", d.SustainedLevel, "sandboxes kept alive during the sustained loop")
	fl.IntVar(&f.cfg.SustainedWorkers, "sustained-workers", d.SustainedWorkers, "create/delete loops running at once")
	fl.IntVar(&f.cfg.ExecStreams, "exec-streams", d.ExecStreams, "concurrent exec streams")
	fl.IntVar(&f.cfg.DensityMax, "density-max", d.DensityMax, "most idle sandboxes for the density figure")
	fl.IntVar(&f.cfg.DensityCeilingMiB, "density-ceiling-mib", d.DensityCeilingMiB, "stop density once the sandboxes took this much host memory")
	fl.Float64Var(&f.cfg.DensityMinFreePct, "density-min-free-pct", d.DensityMinFreePct, "stop density once available memory falls below this % of the total")
	fl.IntVar(&f.cfg.RolloutGroups, "rollout-groups", d.RolloutGroups, "RL rollout groups")
	fl.IntVar(&f.cfg.RolloutG, "rollout-g", d.RolloutG, "children forked per rollout group")
	fl.IntVar(&f.cfg.RolloutSteps, "rollout-steps", d.RolloutSteps, "command steps per rollout")
	fl.StringVar(&f.cfg.Rootfs, "rootfs", "", "rootfs for runsc and runc (default: the base template's, from the template cache)")
	fl.StringVar(&f.cfg.DataDir, "data-dir", d.DataDir, "the server's data dir, where the base rootfs is looked for")
	fl.StringVar(&f.cfg.Runsc, "runsc", "", "runsc binary (default: next to aenv, else $PATH)")
	fl.StringVar(&f.cfg.Envd, "envd", "", "envd binary that runsc-envd runs as its guest's init, as aenv's sandboxes do (default: next to aenv, else $PATH)")
	fl.StringVar(&f.cfg.Runc, "runc", "", "runc binary (default: $PATH)")
	fl.DurationVar(&f.duration, "max-duration", d.MaxDuration, "stop measuring after this long (cleanup comes after)")
}

// config merges the given flags over the full or short defaults.
func (f *benchFlags) config(fl *pflag.FlagSet) bench.Config {
	cfg := bench.DefaultConfig(f.short)
	given := f.cfg
	copies := map[string]func(){
		"iterations":           func() { cfg.Iterations = given.Iterations },
		"template":             func() { cfg.Template = given.Template },
		"memory-mb":            func() { cfg.MemoryMB = given.MemoryMB },
		"fork-count":           func() { cfg.ForkCount = given.ForkCount },
		"fork-iterations":      func() { cfg.ForkIterations = given.ForkIterations },
		"concurrent-creates":   func() { cfg.ConcurrentCreates = given.ConcurrentCreates },
		"sustained-secs":       func() { cfg.SustainedSecs = given.SustainedSecs },
		"sustained-level":      func() { cfg.SustainedLevel = given.SustainedLevel },
		"sustained-workers":    func() { cfg.SustainedWorkers = given.SustainedWorkers },
		"exec-streams":         func() { cfg.ExecStreams = given.ExecStreams },
		"density-max":          func() { cfg.DensityMax = given.DensityMax },
		"density-ceiling-mib":  func() { cfg.DensityCeilingMiB = given.DensityCeilingMiB },
		"density-min-free-pct": func() { cfg.DensityMinFreePct = given.DensityMinFreePct },
		"rollout-groups":       func() { cfg.RolloutGroups = given.RolloutGroups },
		"rollout-g":            func() { cfg.RolloutG = given.RolloutG },
		"rollout-steps":        func() { cfg.RolloutSteps = given.RolloutSteps },
		"data-dir":             func() { cfg.DataDir = given.DataDir },
		"max-duration":         func() { cfg.MaxDuration = f.duration },
	}
	for name, copyFlag := range copies {
		if fl.Changed(name) {
			copyFlag()
		}
	}
	cfg.Rootfs, cfg.Runsc, cfg.Envd, cfg.Runc, cfg.SkipRaw = given.Rootfs, given.Runsc, given.Envd, given.Runc, given.SkipRaw
	for _, g := range f.only {
		if g = strings.TrimSpace(g); g != "" {
			cfg.Only = append(cfg.Only, g)
		}
	}
	return cfg
}

func (a *app) runBench(cmd *cobra.Command, f *benchFlags) error {
	asJSON, err := outputFlag{format: f.output}.json()
	if err != nil {
		return err
	}
	conn, err := f.server.resolve(a.getenv)
	if err != nil {
		return err
	}
	chartTool := ""
	if f.chart != "" { // found before the run, not after it
		if chartTool, err = findChartTool(os.Executable, exec.LookPath); err != nil {
			return err
		}
	}
	cfg := f.config(cmd.Flags())
	cfg.URL, cfg.APIKey = conn.URL, conn.APIKey
	logger := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	report, err := bench.Run(cmd.Context(), cfg, logger)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if f.jsonOut != "" {
		if err := writeJSONFile(f.jsonOut, report); err != nil {
			return err
		}
	}
	if f.chart != "" {
		if err := writeChart(cmd.Context(), chartTool, f.chart, report); err != nil {
			return err
		}
	}
	if asJSON {
		err = writeJSON(a.stdout, report)
	} else {
		err = bench.WriteTable(a.stdout, report)
	}
	if err != nil {
		return err
	}
	if len(report.Failures) > 0 {
		return fmt.Errorf("bench: %d failures (listed in the report)", len(report.Failures))
	}
	return nil
}

func writeJSONFile(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// chartToolName draws charts; it is a binary of its own so that the
// plotting library stays out of aenv, which is also the server.
const chartToolName = "aenv-chart"

// findChartTool finds aenv-chart next to this binary (make build puts
// them together), else on $PATH.
func findChartTool(executable func() (string, error), lookPath func(string) (string, error)) (string, error) {
	if exe, err := executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), chartToolName)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	if p, err := lookPath(chartToolName); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("--chart needs the %s binary next to aenv or on $PATH (make build makes it)", chartToolName)
}

// writeChart has aenv-chart draw the report. It runs after the
// measurements, also of an interrupted run, so it gets its own deadline.
func writeChart(ctx context.Context, tool, path string, report *bench.Report) error {
	data, err := json.Marshal(report)
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, tool, "-", path)
	cmd.Stdin = bytes.NewReader(data)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("chart: %s: %w: %s", tool, err, bytes.TrimSpace(out))
	}
	return nil
}
