// Package monitoring_test checks the Grafana dashboard and the Prometheus
// alert rules beside it: both decode strictly (a misspelled field fails
// here, not when Grafana or Prometheus loads them), and every metric a
// PromQL expression names is one aenv exports. The exported names are read
// from the code itself (every metric defined in the module's Go sources)
// and from the client library's Go and process collectors, so that renaming
// a metric in the code without the dashboard fails this test.
package monitoring_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"sigs.k8s.io/yaml"

	"github.com/aenv-dev/aenv/internal/api"
	"github.com/aenv-dev/aenv/internal/auth"
)

const (
	dashboardFile = "aenv-dashboard.json"
	alertsFile    = "alerts.yaml"
	moduleRoot    = "../.."
)

// prometheusOwn are series Prometheus makes itself for every target.
var prometheusOwn = []string{"up", "scrape_duration_seconds", "scrape_samples_scraped"}

// ruleFile is Prometheus's rule file format, the fields aenv uses.
type ruleFile struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// dashboard is Grafana's dashboard model, the fields aenv's uses.
type dashboard struct {
	UID          string `json:"uid"`
	Title        string `json:"title"`
	Description  string `json:"description"`
	Tags         []string
	Timezone     string `json:"timezone"`
	Schema       int    `json:"schemaVersion"`
	Version      int    `json:"version"`
	Editable     bool   `json:"editable"`
	GraphTooltip int    `json:"graphTooltip"`
	Refresh      string `json:"refresh"`
	Time         struct{ From, To string }
	Annotations  struct{ List []any }
	Templating   struct{ List []variable }
	Panels       []panel `json:"panels"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name       string      `json:"name"`
	Label      string      `json:"label"`
	Type       string      `json:"type"`
	Datasource *datasource `json:"datasource,omitempty"`
	// Query is the plugin's name for a datasource variable, an object for
	// a query variable.
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition,omitempty"`
	IncludeAll bool            `json:"includeAll,omitempty"`
	Multi      bool            `json:"multi,omitempty"`
	AllValue   string          `json:"allValue,omitempty"`
	Current    map[string]any  `json:"current"`
	Refresh    int             `json:"refresh,omitempty"`
	Sort       int             `json:"sort,omitempty"`
	Hide       int             `json:"hide"`
}

type gridPos struct{ H, W, X, Y int }

type panel struct {
	ID          int         `json:"id"`
	Type        string      `json:"type"`
	Title       string      `json:"title"`
	Description string      `json:"description,omitempty"`
	Collapsed   bool        `json:"collapsed,omitempty"`
	GridPos     gridPos     `json:"gridPos"`
	Datasource  *datasource `json:"datasource,omitempty"`
	Panels      []panel     `json:"panels,omitempty"`
	FieldConfig *struct {
		Defaults struct {
			Unit   string `json:"unit"`
			Custom *struct {
				Stacking    struct{ Mode, Group string }
				FillOpacity int `json:"fillOpacity"`
			} `json:"custom,omitempty"`
		} `json:"defaults"`
		Overrides []any `json:"overrides"`
	} `json:"fieldConfig,omitempty"`
	Options map[string]any `json:"options,omitempty"`
	Targets []target       `json:"targets,omitempty"`
}

type target struct {
	RefID        string      `json:"refId"`
	Expr         string      `json:"expr"`
	LegendFormat string      `json:"legendFormat"`
	Datasource   *datasource `json:"datasource"`
}

// decodeStrict decodes JSON refusing unknown fields and trailing data.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the document")
	}
	return nil
}

func loadAlerts(t *testing.T) ruleFile {
	t.Helper()
	data, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.UnmarshalStrict(data, &rf); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	return rf
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := decodeStrict(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// alertExprs are the alert rules' expressions, by alert name.
func alertExprs(rf ruleFile) map[string]string {
	out := map[string]string{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			out["alert "+r.Alert] = r.Expr
		}
	}
	return out
}

// dashboardExprs are the dashboard's queries (panels' and variables'), by
// where they are.
func dashboardExprs(t *testing.T, d dashboard) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out[fmt.Sprintf("panel %q %s", p.Title, tg.RefID)] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
			RefID string `json:"refId"`
		}
		if err := decodeStrict(v.Query, &q); err != nil {
			t.Fatalf("variable %s: query: %v", v.Name, err)
		}
		// label_values(<selector>, <label>): the selector names metrics.
		inner, ok := strings.CutPrefix(q.Query, "label_values(")
		i := strings.LastIndex(inner, ",")
		if !ok || i < 0 || !strings.HasSuffix(inner, ")") {
			t.Fatalf("variable %s: query %q is not label_values(<selector>, <label>)", v.Name, q.Query)
		}
		out["variable "+v.Name] = inner[:i]
	}
	return out
}

func TestAlertRules(t *testing.T) {
	rf := loadAlerts(t)
	if len(rf.Groups) == 0 {
		t.Fatal("no rule groups")
	}
	seen := map[string]bool{}
	for _, g := range rf.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: needs a name and rules", g.Name)
		}
		for _, r := range g.Rules {
			if r.Alert == "" || seen[r.Alert] {
				t.Errorf("group %s: alert name %q empty or repeated", g.Name, r.Alert)
			}
			seen[r.Alert] = true
			if strings.TrimSpace(r.Expr) == "" {
				t.Errorf("%s: no expression", r.Alert)
			}
			if r.For != "" {
				if d, err := time.ParseDuration(r.For); err != nil || d <= 0 {
					t.Errorf("%s: for %q is not a duration", r.Alert, r.For)
				}
			}
			if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: needs a summary and a description", r.Alert)
			}
		}
	}
	// The operator-facing promises of docs/monitoring.md.
	for _, name := range []string{"AenvNodeDown", "AenvNodeNoHeartbeat", "AenvCreateErrorRate", "AenvCreateLatencyHigh",
		"AenvNodeMemoryNearlyFull", "AenvDiskFull"} {
		if !seen[name] {
			t.Errorf("alert %s missing", name)
		}
	}
}

func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" || d.Schema == 0 {
		t.Errorf("uid %q, title %q, schemaVersion %d: all needed", d.UID, d.Title, d.Schema)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	if !vars["datasource"] {
		t.Error("no datasource variable: the dashboard would be tied to one Prometheus")
	}
	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.ID == 0 || ids[p.ID] {
				t.Errorf("panel %q: id %d zero or repeated", p.Title, p.ID)
			}
			ids[p.ID] = true
			if p.Title == "" || p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("panel %q: bad title or position %+v", p.Title, p.GridPos)
			}
			switch p.Type {
			case "row":
			case "timeseries", "stat":
				if len(p.Targets) == 0 {
					t.Errorf("panel %q: no queries", p.Title)
				}
				if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
					t.Errorf("panel %q: datasource %+v, want the ${datasource} variable", p.Title, p.Datasource)
				}
				refs := map[string]bool{}
				for _, tg := range p.Targets {
					if tg.RefID == "" || refs[tg.RefID] || strings.TrimSpace(tg.Expr) == "" {
						t.Errorf("panel %q: query %q: refId empty or repeated, or no expression", p.Title, tg.RefID)
					}
					refs[tg.RefID] = true
				}
			default:
				t.Errorf("panel %q: type %q not checked here", p.Title, p.Type)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
}

// TestMetricNamesExist is the lint the issue asks for: every metric an
// alert or a panel names is exported by aenv (or made by Prometheus), and
// every aenv metric is on the dashboard.
func TestMetricNamesExist(t *testing.T) {
	known := exportedMetrics(t)
	exprs := alertExprs(loadAlerts(t))
	for where, e := range dashboardExprs(t, loadDashboard(t)) {
		exprs[where] = e
	}
	used := map[string]bool{}
	for where, e := range exprs {
		names, err := metricNames(e)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		if len(names) == 0 {
			t.Errorf("%s: %q names no metric", where, e)
		}
		if err := checkNames(names, known); err != nil {
			t.Errorf("%s: %v", where, err)
		}
		for _, n := range names {
			used[n] = true
		}
	}
	// A metric the code exports and the dashboard never shows is one an
	// operator does not see: add a panel for it.
	for _, m := range aenvMetrics(t) {
		if !slices.ContainsFunc(m.series(), func(s string) bool { return used[s] }) {
			t.Errorf("metric %s is exported but neither the dashboard nor an alert uses it", m.name)
		}
	}
}

// A wrong metric name fails the lint: the check is not vacuous.
func TestMetricNamesCatchWrongName(t *testing.T) {
	known := exportedMetrics(t)
	for _, tc := range []struct {
		expr string
		bad  string
	}{
		{`sum(aenv_sandboxes_lives)`, "aenv_sandboxes_lives"},
		{`rate(aenv_api_request_duration_seconds_total[5m])`, "aenv_api_request_duration_seconds_total"},
		{`histogram_quantile(0.99, sum by (le) (rate(aenv_build_duration_bucket[5m])))`, "aenv_build_duration_bucket"},
		{`aenv_node_sandboxes / aenv_node_capacity_sandbox`, "aenv_node_capacity_sandbox"},
	} {
		names, err := metricNames(tc.expr)
		if err != nil {
			t.Fatalf("%q: %v", tc.expr, err)
		}
		err = checkNames(names, known)
		if err == nil || !strings.Contains(err.Error(), tc.bad) {
			t.Errorf("%q: error %v, want one naming %s", tc.expr, err, tc.bad)
		}
	}
	// The same, through the real alert file with one name misspelled.
	rf := loadAlerts(t)
	rf.Groups[0].Rules[2].Expr = strings.Replace(rf.Groups[0].Rules[2].Expr, "aenv_gateway_node_heartbeat_age_seconds",
		"aenv_gateway_node_heartbeat_seconds", 1)
	var failed bool
	for _, e := range alertExprs(rf) {
		names, _ := metricNames(e)
		failed = failed || checkNames(names, known) != nil
	}
	if !failed {
		t.Error("a misspelled metric in the alert rules passed the check")
	}
}

func checkNames(names []string, known map[string]bool) error {
	var unknown []string
	for _, n := range names {
		if !known[n] {
			unknown = append(unknown, n)
		}
	}
	if len(unknown) > 0 {
		return fmt.Errorf("no such metric: %s", strings.Join(unknown, ", "))
	}
	return nil
}

// metric is one metric defined in aenv's code.
type metric struct {
	name string
	kind string // counter, gauge, histogram, summary, or "" (a Desc: collected as any kind)
	pos  string
}

// series are the names the metric's samples have in Prometheus.
func (m metric) series() []string {
	switch m.kind {
	case "histogram":
		return []string{m.name + "_bucket", m.name + "_sum", m.name + "_count"}
	case "summary":
		return []string{m.name, m.name + "_sum", m.name + "_count"}
	}
	return []string{m.name}
}

// exportedMetrics is every series name a scrape of aenv may hold, and
// those Prometheus adds.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	known := map[string]bool{}
	for _, m := range aenvMetrics(t) {
		for _, s := range m.series() {
			known[s] = true
		}
	}
	for _, n := range prometheusOwn {
		known[n] = true
	}
	// The Go and process collectors every aenv registry holds, as built
	// by this client library on this platform.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, s := range (metric{name: f.GetName(), kind: strings.ToLower(f.GetType().String())}).series() {
			known[s] = true
		}
	}
	return known
}

// aenvMetrics finds every metric the module's code defines: the Name of
// each prometheus.{Counter,Gauge,Histogram,Summary}Opts literal and the
// name of each prometheus.NewDesc. A name that is not a string literal (or
// Opts with a Namespace or Subsystem) fails the test, so that none is
// missed.
func aenvMetrics(t *testing.T) []metric {
	t.Helper()
	var out []metric
	fset := token.NewFileSet()
	err := filepath.WalkDir(moduleRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "testdata", "vendor":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		found, err := metricsIn(fset, f)
		out = append(out, found...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no metric found in the code")
	}
	return out
}

var optsKinds = map[string]string{"CounterOpts": "counter", "GaugeOpts": "gauge", "HistogramOpts": "histogram",
	"SummaryOpts": "summary"}

func metricsIn(fset *token.FileSet, f *ast.File) ([]metric, error) {
	prom := ""
	for _, imp := range f.Imports {
		if imp.Path.Value == `"github.com/prometheus/client_golang/prometheus"` {
			prom = "prometheus"
			if imp.Name != nil {
				prom = imp.Name.Name
			}
		}
	}
	if prom == "" {
		return nil, nil
	}
	isProm := func(e ast.Expr) (string, bool) {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return "", false
		}
		x, ok := sel.X.(*ast.Ident)
		return sel.Sel.Name, ok && x.Name == prom
	}
	literal := func(e ast.Expr) (string, error) {
		lit, ok := e.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return "", fmt.Errorf("%s: a metric name that is not a string literal: this test cannot check it",
				fset.Position(e.Pos()))
		}
		return strconv.Unquote(lit.Value)
	}
	var out []metric
	var errs []error
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CompositeLit:
			typ, ok := isProm(n.Type)
			kind := optsKinds[typ]
			if !ok || kind == "" {
				return true
			}
			for _, el := range n.Elts {
				kv, ok := el.(*ast.KeyValueExpr)
				if !ok {
					errs = append(errs, fmt.Errorf("%s: unkeyed %s", fset.Position(n.Pos()), typ))
					continue
				}
				switch key := kv.Key.(*ast.Ident).Name; key {
				case "Name":
					name, err := literal(kv.Value)
					if err != nil {
						errs = append(errs, err)
						continue
					}
					out = append(out, metric{name: name, kind: kind, pos: fset.Position(n.Pos()).String()})
				case "Namespace", "Subsystem":
					errs = append(errs, fmt.Errorf("%s: %s.%s set: write the whole name in Name", fset.Position(kv.Pos()), typ, key))
				}
			}
		case *ast.CallExpr:
			if fn, ok := isProm(n.Fun); ok && fn == "NewDesc" && len(n.Args) > 0 {
				name, err := literal(n.Args[0])
				if err != nil {
					errs = append(errs, err)
					return true
				}
				out = append(out, metric{name: name, pos: fset.Position(n.Pos()).String()})
			}
		}
		return true
	})
	return out, errors.Join(errs...)
}

// The code scan finds what a real registry holds: the API's histogram,
// registered by the API's own constructor and observed by a request.
func TestScanMatchesRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := api.NewCatalog(api.Config{Authorize: func(*http.Request) (auth.Principal, bool) { return auth.Principal{}, false }}, nil,
		slog.New(slog.DiscardHandler), reg)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/no-such-path", nil))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) == 0 {
		t.Fatal("the API registered nothing")
	}
	scanned := map[string]string{}
	for _, m := range aenvMetrics(t) {
		scanned[m.name] = m.kind
	}
	for _, f := range families {
		kind, ok := scanned[f.GetName()]
		if !ok {
			t.Errorf("registry has %s, the code scan does not", f.GetName())
		} else if want := strings.ToLower(f.GetType().String()); kind != want {
			t.Errorf("%s: scanned as %q, registered as %q", f.GetName(), kind, want)
		}
	}
}
