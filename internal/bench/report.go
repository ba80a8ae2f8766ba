package bench

import (
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aenv-dev/aenv/internal/meminfo"
)

// The systems a figure can be measured on. aenv is the server under test;
// runsc and runc are driven directly on the same rootfs for comparison.
// runsc-envd is runsc running aenv's guest (envd as the init, as aenv's
// sandboxes do) beside runsc running `sleep`: what aenv costs over runsc
// is then told apart from what its guest agent costs.
const (
	SystemAenv      = "aenv"
	SystemRunsc     = "runsc"
	SystemRunscEnvd = "runsc-envd"
	SystemRunc      = "runc"
)

// rawSystems are the systems aenv's figures are divided by, in order.
var rawSystems = [...]string{SystemRunsc, SystemRunscEnvd, SystemRunc}

// Units of figures.
const (
	UnitMs        = "ms"
	UnitPerSecond = "/s"
	UnitPerMinute = "/min"
	UnitCount     = "count"
	UnitMiB       = "MiB"
	UnitPercent   = "%"
)

// Report is the outcome of one bench run.
type Report struct {
	Machine  Machine   `json:"machine"`
	Server   string    `json:"server"`
	Short    bool      `json:"short"`
	Started  time.Time `json:"started"`
	Seconds  float64   `json:"seconds"`
	Figures  []*Figure `json:"figures"`
	Notes    []string  `json:"notes,omitempty"`
	Failures []string  `json:"failures,omitempty"`
	// Raw is where the raw runtimes' containers lived, so a caller can
	// check nothing of them is left.
	Raw *RawInfo `json:"raw,omitempty"`
}

// RawInfo names what the raw runtimes were given.
type RawInfo struct {
	Rootfs          string `json:"rootfs"`
	Runsc           string `json:"runsc,omitempty"`
	Envd            string `json:"envd,omitempty"`
	Runc            string `json:"runc,omitempty"`
	WorkDir         string `json:"workDir"`
	ContainerPrefix string `json:"containerPrefix"`
}

// Machine describes where the run happened.
type Machine struct {
	CPUs      int    `json:"cpus"`
	MemoryMiB int64  `json:"memoryMiB"`
	Kernel    string `json:"kernel"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
}

// Figure is one measured quantity, on aenv and on the raw runtimes where
// an equivalent exists.
type Figure struct {
	Name  string `json:"name"`
	Title string `json:"title"`
	Group string `json:"group"`
	Unit  string `json:"unit"`
	// Results by system (aenv, runsc, runc).
	Results map[string]*Result `json:"results"`
	// Ratios are aenv's p50 divided by each other system's p50.
	Ratios map[string]float64 `json:"ratios,omitempty"`
	Note   string             `json:"note,omitempty"`
}

// Result is one system's samples of a figure.
type Result struct {
	Stats
	Errors     int       `json:"errors"`
	FirstError string    `json:"firstError,omitempty"`
	Samples    []float64 `json:"samples"`
}

// IsLatency says whether the figure is a duration (and so belongs in the
// latency chart).
func (f *Figure) IsLatency() bool { return f.Unit == UnitMs }

// Figure returns the figure called name, or nil.
func (r *Report) Figure(name string) *Figure {
	for _, f := range r.Figures {
		if f.Name == name {
			return f
		}
	}
	return nil
}

// recorder collects samples from concurrent measurements.
type recorder struct {
	mu      sync.Mutex
	figures []*Figure
	byName  map[string]*Figure
}

func newRecorder() *recorder { return &recorder{byName: map[string]*Figure{}} }

// figure declares a figure; declaring one twice returns the first.
func (r *recorder) figure(name, title, group, unit string) *Figure {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f, ok := r.byName[name]; ok {
		return f
	}
	f := &Figure{Name: name, Title: title, Group: group, Unit: unit, Results: map[string]*Result{}}
	r.figures = append(r.figures, f)
	r.byName[name] = f
	return f
}

func (r *recorder) result(f *Figure, system string) *Result {
	res, ok := f.Results[system]
	if !ok {
		res = &Result{Samples: []float64{}}
		f.Results[system] = res
	}
	return res
}

// add records one sample of f on system.
func (r *recorder) add(f *Figure, system string, v float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := r.result(f, system)
	res.Samples = append(res.Samples, v)
}

// addDuration records d in milliseconds.
func (r *recorder) addDuration(f *Figure, system string, d time.Duration) {
	r.add(f, system, float64(d.Microseconds())/1000)
}

// fail counts a failed attempt of f on system, keeping the first message.
func (r *recorder) fail(f *Figure, system string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := r.result(f, system)
	res.Errors++
	if res.FirstError == "" {
		res.FirstError = err.Error()
	}
}

// describe says how f is measured, once.
func (r *recorder) describe(f *Figure, text string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f.Note == "" {
		f.Note = text
	}
}

// finish computes every figure's stats and ratios.
func (r *recorder) finish() []*Figure {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.figures {
		for _, res := range f.Results {
			res.Stats = Summarize(res.Samples)
		}
		aenv, ok := f.Results[SystemAenv]
		if !ok {
			continue
		}
		for _, other := range rawSystems {
			if res, ok := f.Results[other]; ok {
				if q := ratio(aenv.P50, res.P50); q > 0 {
					if f.Ratios == nil {
						f.Ratios = map[string]float64{}
					}
					f.Ratios[other] = q
				}
			}
		}
	}
	return r.figures
}

// describeMachine reads CPU count, memory, kernel and OS of this host.
func describeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Arch: runtime.GOARCH, OS: osName()}
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		m.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	if kb, ok := memKiB("MemTotal"); ok {
		m.MemoryMiB = int64(kb >> 10)
	}
	return m
}

// osName is PRETTY_NAME of /etc/os-release.
func osName() string {
	data, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return runtime.GOOS
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return runtime.GOOS
}

// memKiB returns a /proc/meminfo field in KiB, the unit of the density
// limits.
func memKiB(field string) (uint64, bool) {
	v, err := meminfo.Read(field)
	return v >> 10, err == nil
}
