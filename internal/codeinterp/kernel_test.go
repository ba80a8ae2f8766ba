package codeinterp

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/aenv-dev/aenv/internal/roottest"
)

// debianPython is the Python the tests run kernels with: Debian's, into
// which scripts/install-deps.sh installs IPython and matplotlib, as the
// template's is; a python3 earlier on PATH (pyenv, a venv) may lack them.
func debianPython() string {
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	return "python3"
}

// kernelServer serves a Service whose kernels are kernel.py itself, run
// with the machine's python3, in a temp dir.
func kernelServer(t *testing.T) string {
	_, url := kernelService(t, nil)
	return url
}

// kernelService is kernelServer's Service and URL; env, if not nil, is the
// sandbox env (Config.Env).
func kernelService(t *testing.T, env func() map[string]string) (*Service, string) {
	s := New(Config{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Python: debianPython(),
		Prepare: func(cmd *exec.Cmd, cwd string) error {
			cmd.Env = os.Environ()
			cmd.Dir = t.TempDir()
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			return nil
		},
		Env: env,
	})
	t.Cleanup(s.Close)
	return s, newServer(t, s)
}

// TestKernelPy runs kernel.py itself, with the machine's python3: it needs
// IPython, which the code interpreter template has and a developer machine
// may not (then it is skipped; the e2e suite covers it in a sandbox).
func TestKernelPy(t *testing.T) {
	if err := exec.Command(debianPython(), "-c", "import IPython").Run(); err != nil {
		// scripts/install-deps.sh installs it: required where tests must not skip.
		roottest.SkipOrFail(t, "python3 with IPython not installed")
	}
	srv := kernelServer(t)
	for _, tc := range []struct {
		code string
		want []line // compared on Type, Text and Name where set
	}{
		{"x = 41\nprint('hi')\nx + 1", []line{{Type: "stdout", Text: "hi\n"}, {Type: "result", Text: "42"}}},
		{"import os\nprint('a')\nos.system('echo raw')\nprint('b')",
			[]line{{Type: "stdout", Text: "a\n"}, {Type: "stdout", Text: "raw\n"}, {Type: "stdout", Text: "b\n"}}},
		{"import sys\nprint('e', file=sys.stderr)\n1/0", []line{{Type: "stderr", Text: "e\n"}, {Type: "error", Name: "ZeroDivisionError"}}},
		{"def f(:", []line{{Type: "error", Name: "SyntaxError"}}},
		{"from IPython.display import display\ndisplay('shown')\nx", []line{{Type: "result", Text: "'shown'"}, {Type: "result", Text: "41"}}},
		{"print('no newline', end='')", []line{{Type: "stdout", Text: "no newline"}}},
		{"import os; os.environ.get('PER_RUN')", []line{{Type: "result", Text: "'yes'"}}},
		{"import os; os.environ.get('PER_RUN')", nil},
	} {
		body := map[string]any{"code": tc.code}
		if strings.Contains(tc.code, "PER_RUN") && tc.want != nil {
			body["env_vars"] = map[string]string{"PER_RUN": "yes"}
		}
		lines := execute(t, srv, body)
		lastTwo(t, lines)
		got := lines[:len(lines)-2]
		if len(got) != len(tc.want) {
			t.Errorf("%q: lines %+v, want %+v", tc.code, got, tc.want)
			continue
		}
		for i, w := range tc.want {
			g := got[i]
			if g.Type != w.Type || w.Text != "" && g.Text != w.Text || w.Name != "" && g.Name != w.Name {
				t.Errorf("%q: line %d is %+v, want %+v", tc.code, i, g, w)
			}
		}
	}
	// An interrupted cell raises KeyboardInterrupt in the kernel, which
	// keeps its state.
	ctx, cancel := context.WithCancel(context.Background())
	res := post(t, ctx, srv+"/execute", map[string]any{"code": "import time\nx = 7\nprint('sleeping')\ntime.sleep(600)"}, nil)
	buf := make([]byte, 1)
	_, _ = res.Body.Read(buf) // the first line has begun: the cell runs
	cancel()
	res.Body.Close()
	lines := execute(t, srv, map[string]any{"code": "x"})
	if lines[0].Type != "result" || lines[0].Text != "7" {
		t.Errorf("after an interrupt: %+v", lines)
	}
}

// events runs code and returns its streamed lines whole, failing the test
// on an error line.
func events(t *testing.T, url, code string) []map[string]any {
	t.Helper()
	res := post(t, context.Background(), url+"/execute", map[string]any{"code": code}, nil)
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("execute %q: %d %s", code, res.StatusCode, b)
	}
	var out []map[string]any
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, maxEventBytes)
	for sc.Scan() {
		var e map[string]any
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if e["type"] == "error" {
			t.Errorf("%q: error %v: %v\n%v", code, e["name"], e["value"], e["traceback"])
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// figures returns the results of running code that are images.
func figures(t *testing.T, url, code string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, e := range events(t, url, code) {
		if e["type"] == "result" && (e["png"] != nil || e["svg"] != nil || e["jpeg"] != nil) {
			out = append(out, e)
		}
	}
	return out
}

// isPNG tells whether a result's png is a base64 PNG.
func isPNG(v any) bool {
	s, _ := v.(string)
	b, err := base64.StdEncoding.DecodeString(s)
	return err == nil && strings.HasPrefix(string(b), "\x89PNG\r\n\x1a\n")
}

// mismatches compares got with want, decoded JSON both: objects on want's
// keys only (got may say more), arrays and values whole.
func mismatches(path string, want, got any) []string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: %v, want an object", path, got)}
		}
		var out []string
		for k, wv := range w {
			gv, ok := g[k]
			if !ok {
				out = append(out, fmt.Sprintf("%s.%s missing", path, k))
				continue
			}
			out = append(out, mismatches(path+"."+k, wv, gv)...)
		}
		sort.Strings(out)
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return []string{fmt.Sprintf("%s: %v, want %v", path, got, want)}
		}
		var out []string
		for i := range w {
			out = append(out, mismatches(fmt.Sprintf("%s[%d]", path, i), w[i], g[i])...)
		}
		return out
	default:
		if !reflect.DeepEqual(want, got) {
			return []string{fmt.Sprintf("%s: %v, want %v", path, got, want)}
		}
		return nil
	}
}

// The fields of the SDK's chart types (@e2b/code-interpreter's
// LineChart, ScatterChart, BarChart, ...): a chart has exactly these.
var (
	pointChartKeys = []string{"elements", "title", "type", "x_label", "x_scale", "x_tick_labels", "x_ticks", "x_unit",
		"y_label", "y_scale", "y_tick_labels", "y_ticks", "y_unit"}
	chart2DKeys = []string{"elements", "title", "type", "x_label", "x_unit", "y_label", "y_unit"}
	chartKeys   = []string{"elements", "title", "type"}
)

// TestKernelPyCharts runs kernel.py's matplotlib figures: each comes as an
// image with the chart E2B's SDK reads (Result.chart), in the formats
// asked for. It needs matplotlib beside IPython (python3-matplotlib,
// which scripts/install-deps.sh installs).
func TestKernelPyCharts(t *testing.T) {
	if err := exec.Command(debianPython(), "-c", "import IPython, matplotlib").Run(); err != nil {
		roottest.SkipOrFail(t, "python3 with IPython and matplotlib not installed")
	}
	srv := kernelServer(t)
	events(t, srv, "import datetime\nimport numpy as np\nimport matplotlib.pyplot as plt")
	for _, tc := range []struct {
		name, code string
		keys       []string // the chart's keys, exactly
		want       string   // JSON the chart matches (see mismatches)
	}{
		{"lines", `fig, ax = plt.subplots()
ax.plot([0, 1, 2], [0, 1, 4], label='squares')
ax.plot([0, 1, 2], [0, 1, 8], label='cubes')
ax.plot([0, 2], [5, 5])
ax.axhline(3)
ax.set_xticks([0, 1, 2]); ax.set_yticks([0, 4, 8])
ax.set_title('Powers'); ax.set_xlabel('Time (s)'); ax.set_ylabel('Value [m]'); ax.legend();`,
			pointChartKeys, `{"type": "line", "title": "Powers", "x_label": "Time (s)", "y_label": "Value [m]",
			"x_unit": "s", "y_unit": "m", "x_ticks": [0, 1, 2], "x_tick_labels": ["0", "1", "2"], "x_scale": "linear",
			"y_ticks": [0, 4, 8], "y_tick_labels": ["0", "4", "8"], "y_scale": "linear", "elements": [
			{"label": "squares", "points": [[0, 0], [1, 1], [2, 4]]},
			{"label": "cubes", "points": [[0, 0], [1, 1], [2, 8]]},
			{"label": "Line 3", "points": [[0, 5], [2, 5]]}]}`},
		{"dates", `fig, ax = plt.subplots()
ax.plot([datetime.date(2024, 1, 1), datetime.date(2024, 1, 2), datetime.date(2024, 1, 3)], [1, 2, 3], label='days')
ax.plot(np.array(['2024-01-01T12', '2024-01-02T12'], dtype='datetime64[h]'), [2.5, float('nan')], label='noons')
ax.set_xticks([datetime.date(2024, 1, 1), datetime.date(2024, 1, 3)])
plt.title('Days'); plt.show()`,
			pointChartKeys, `{"type": "line", "title": "Days", "x_label": null, "x_unit": null, "x_scale": "datetime",
			"x_ticks": ["2024-01-01T00:00:00+00:00", "2024-01-03T00:00:00+00:00"], "y_scale": "linear", "elements": [
			{"label": "days", "points": [["2024-01-01", 1], ["2024-01-02", 2], ["2024-01-03", 3]]},
			{"label": "noons", "points": [["2024-01-01T12:00:00", 2.5], ["2024-01-02T12:00:00", null]]}]}`},
		// Labels given to the legend alone are the series' labels.
		{"scatter", `plt.scatter(['a', 'b', 'c'], [1, 2, 3]); plt.scatter(['b'], [5]); plt.legend(['first', 'second'])
plt.yticks([1, 5]); plt.xlabel('Letter'); plt.show()`,
			pointChartKeys, `{"type": "scatter", "title": null, "x_label": "Letter", "x_scale": "categorical",
			"x_ticks": ["a", "b", "c"], "x_tick_labels": ["a", "b", "c"], "y_ticks": [1, 5], "y_tick_labels": ["1", "5"],
			"elements": [{"label": "first", "points": [["a", 1], ["b", 2], ["c", 3]]},
			{"label": "second", "points": [["b", 5]]}]}`},
		// E2B's documented example.
		{"bars", `authors = ['Author A', 'Author B', 'Author C', 'Author D']
sales = [100, 200, 300, 400]
plt.figure(figsize=(10, 6))
plt.bar(authors, sales, label='Books Sold', color='blue')
plt.xlabel('Authors')
plt.ylabel('Number of Books Sold')
plt.title('Book Sales by Authors')
plt.tight_layout()
plt.show()`,
			chart2DKeys, `{"type": "bar", "title": "Book Sales by Authors", "x_label": "Authors",
			"y_label": "Number of Books Sold", "x_unit": null, "y_unit": null, "elements": [
			{"label": "Author A", "group": "Books Sold", "value": 100},
			{"label": "Author B", "group": "Books Sold", "value": 200},
			{"label": "Author C", "group": "Books Sold", "value": 300},
			{"label": "Author D", "group": "Books Sold", "value": 400}]}`},
		// Grouped bars beside their ticks are named by them.
		{"grouped bars", `x = np.arange(3); w = 0.4
fig, ax = plt.subplots()
ax.bar(x - w / 2, [1, 2, 3], w, label='Men'); ax.bar(x + w / 2, [3, 2, 1], w, label='Women')
ax.set_xticks(x); ax.set_xticklabels(['G1', 'G2', 'G3']); ax.set_ylabel('Count');`,
			chart2DKeys, `{"type": "bar", "title": null, "x_label": null, "y_label": "Count", "elements": [
			{"label": "G1", "group": "Men", "value": 1}, {"label": "G2", "group": "Men", "value": 2},
			{"label": "G3", "group": "Men", "value": 3}, {"label": "G1", "group": "Women", "value": 3},
			{"label": "G2", "group": "Women", "value": 2}, {"label": "G3", "group": "Women", "value": 1}]}`},
		// x is the axis of the categories.
		{"horizontal bars", `plt.barh(['x', 'y'], [5, 7]); plt.xlabel('Amount ($)'); plt.ylabel('Item');`,
			chart2DKeys, `{"type": "bar", "x_label": "Item", "y_label": "Amount ($)", "x_unit": null, "y_unit": "$",
			"elements": [{"label": "x", "group": "Group 1", "value": 5}, {"label": "y", "group": "Group 1", "value": 7}]}`},
		{"pie", `fig, ax = plt.subplots()
ax.pie([90, 10], labels=['No', 'No, in blue'], autopct='%1.1f%%', startangle=90)
ax.axis('equal'); plt.title('Will I wake up early tomorrow?');`,
			chartKeys, `{"type": "pie", "title": "Will I wake up early tomorrow?", "elements": [
			{"label": "No", "angle": 324, "radius": 1}, {"label": "No, in blue", "angle": 36, "radius": 1}]}`},
		{"box plot", `fig, ax = plt.subplots()
ax.boxplot([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 100]])
ax.set_title('Spread'); ax.set_ylabel('Score');`,
			chart2DKeys, `{"type": "box_and_whisker", "title": "Spread", "x_label": null, "y_label": "Score", "elements": [
			{"label": "1", "min": 1, "first_quartile": 2, "median": 3, "third_quartile": 4, "max": 5, "outliers": []},
			{"label": "2", "min": 1, "first_quartile": 2.25, "median": 3.5, "third_quartile": 4.75, "max": 5,
			"outliers": [100]}]}`},
		{"superchart", `fig, axs = plt.subplots(1, 3); fig.suptitle('Several')
axs[0].plot([1, 2]); axs[0].set_title('left'); axs[1].pie([1, 3], labels=['a', 'b'])
axs[2].add_patch(plt.Circle((0, 0), 1));`,
			chartKeys, `{"type": "superchart", "title": "Several", "elements": [
			{"type": "line", "title": "left", "elements": [{"label": "Line 1", "points": [[0, 1], [1, 2]]}]},
			{"type": "pie", "title": null, "elements": [{"label": "a", "angle": 90, "radius": 1},
			{"label": "b", "angle": 270, "radius": 1}]},
			{"type": "unknown", "title": null, "elements": []}]}`},
		// A colorbar is no chart of its own.
		{"colorbar", `fig, ax = plt.subplots(); sc = ax.scatter([1, 2], [3, 4], c=[1, 2]); fig.colorbar(sc);`,
			pointChartKeys, `{"type": "scatter", "elements": [{"label": "Series 1", "points": [[1, 3], [2, 4]]}]}`},
		{"unknown", `fig, ax = plt.subplots(); ax.add_artist(plt.Circle((0, 0), 1)); ax.set_title('circles');`,
			chartKeys, `{"type": "unknown", "title": "circles", "elements": []}`},
		// A figure as the cell's value is its result, sent once.
		{"value", "fig, ax = plt.subplots(); ax.plot([3, 4]); fig",
			pointChartKeys, `{"type": "line", "elements": [{"label": "Line 1", "points": [[0, 3], [1, 4]]}]}`},
	} {
		results := figures(t, srv, tc.code)
		if len(results) != 1 {
			t.Errorf("%s: %d figures, want 1: %v", tc.name, len(results), results)
			continue
		}
		r := results[0]
		if !isPNG(r["png"]) || !strings.HasPrefix(r["text"].(string), "<Figure size") {
			t.Errorf("%s: result %v, want a PNG and the figure's text", tc.name, r)
		}
		if main := tc.name == "value"; r["is_main_result"] != main {
			t.Errorf("%s: is_main_result %v, want %v", tc.name, r["is_main_result"], main)
		}
		chart, ok := r["chart"].(map[string]any)
		if !ok {
			t.Errorf("%s: no chart: %v", tc.name, r)
			continue
		}
		keys := slices.Sorted(maps.Keys(chart))
		if !slices.Equal(keys, tc.keys) {
			t.Errorf("%s: chart keys %v, want %v", tc.name, keys, tc.keys)
		}
		var want any
		if err := json.Unmarshal([]byte(tc.want), &want); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for _, m := range mismatches("chart", want, chart) {
			t.Errorf("%s: %s", tc.name, m)
		}
	}

	// Reading the chart fails (here a method it calls raises): the image
	// is sent without one, and the cell has no error.
	r := figures(t, srv, "fig, ax = plt.subplots(); ax.plot([1, 2]); ax.get_title = lambda *a, **k: 1 / 0")
	if len(r) != 1 || !isPNG(r[0]["png"]) || r[0]["chart"] != nil {
		t.Errorf("chart extraction failing: %v, want one PNG result without a chart", r)
	}
	// No axes, no chart.
	r = figures(t, srv, "plt.figure();")
	if len(r) != 1 || !isPNG(r[0]["png"]) || r[0]["chart"] != nil {
		t.Errorf("an empty figure: %v, want one PNG result without a chart", r)
	}

	// display(fig) sends the figure then; the cell's end sends it again
	// only if it changed since.
	r = figures(t, srv, "fig, ax = plt.subplots(); ax.plot([1, 2]); display(fig); print('shown')")
	if len(r) != 1 {
		t.Errorf("display(fig): %d figures, want 1", len(r))
	}
	r = figures(t, srv, "fig, ax = plt.subplots(); ax.plot([1, 2]); display(fig); ax.set_title('later');")
	if len(r) != 2 || r[0]["chart"].(map[string]any)["title"] != nil || r[1]["chart"].(map[string]any)["title"] != "later" {
		t.Errorf("display(fig) then a change: %v, want the figure before and after", r)
	}

	// Formats: SVG when asked, as in Jupyter, by %config or by
	// set_matplotlib_formats; PNG back when asked.
	for _, tc := range []struct {
		name, code string
		want       []string // the image keys of the result
	}{
		{"%config figure_formats", "%config InlineBackend.figure_formats = ['svg']", []string{"svg"}},
		{"%config figure_format", "%config InlineBackend.figure_format = 'png'", []string{"png"}},
		{"several", "%config InlineBackend.figure_formats = {'png', 'jpeg', 'svg'}", []string{"jpeg", "png", "svg"}},
		{"set_matplotlib_formats", "from matplotlib_inline.backend_inline import set_matplotlib_formats\nset_matplotlib_formats('svg')", []string{"svg"}},
		{"back to PNG", "%config InlineBackend.figure_formats = ['png']", []string{"png"}},
		{"%matplotlib inline", "%matplotlib inline", []string{"png"}},
	} {
		r := figures(t, srv, tc.code+"\nplt.plot([1, 2]); plt.title('formats'); plt.show()")
		if len(r) != 1 {
			t.Errorf("%s: %d figures, want 1", tc.name, len(r))
			continue
		}
		var got []string
		for _, k := range []string{"jpeg", "pdf", "png", "svg"} {
			if r[0][k] != nil {
				got = append(got, k)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: images %v, want %v", tc.name, got, tc.want)
		}
		if svg, ok := r[0]["svg"].(string); ok && !strings.Contains(svg, "<svg") {
			t.Errorf("%s: svg %.100q", tc.name, svg)
		}
		if png, ok := r[0]["png"]; ok && !isPNG(png) {
			t.Errorf("%s: png is not a PNG", tc.name)
		}
		if chart, _ := r[0]["chart"].(map[string]any); chart == nil || chart["title"] != "formats" {
			t.Errorf("%s: chart %v", tc.name, r[0]["chart"])
		}
	}
	// A format matplotlib does not know is refused, and changes nothing.
	lines := events(t, srv, "%config InlineBackend.figure_formats = ['bogus']")
	if !strings.Contains(fmt.Sprint(lines), "unsupported figure formats") {
		t.Errorf("a bogus format: %v", lines)
	}
}
