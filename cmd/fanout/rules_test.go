package main

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"sigs.k8s.io/yaml"
)

// rulesFile is the Prometheus rules file the repository ships.
const rulesFile = "../../deploy/prometheus/fanout-rules.yaml"

// instrument is one otel instrument the code creates.
type instrument struct {
	name, unit, kind, where string
}

// instrumentKinds maps the otel meter's constructors to what the
// Prometheus exporter makes of them.
var instrumentKinds = map[string]string{
	"Int64Counter": "counter", "Float64Counter": "counter",
	"Int64ObservableCounter": "counter", "Float64ObservableCounter": "counter",
	"Int64UpDownCounter": "gauge", "Float64UpDownCounter": "gauge",
	"Int64ObservableUpDownCounter": "gauge", "Float64ObservableUpDownCounter": "gauge",
	"Int64Gauge": "gauge", "Float64Gauge": "gauge",
	"Int64ObservableGauge": "gauge", "Float64ObservableGauge": "gauge",
	"Int64Histogram": "histogram", "Float64Histogram": "histogram",
}

// scanCode reads every non-test Go file of the module and returns the
// instruments it creates and the attribute keys it names (attribute.Key,
// attribute.String, ... with a constant name). A name that is neither a
// literal nor a constant of its package is an error: it could not be
// checked.
func scanCode(t *testing.T, root string) ([]instrument, map[string]bool) {
	t.Helper()
	fset := token.NewFileSet()
	files := map[string][]*ast.File{} // by directory
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "node_modules" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		files[filepath.Dir(path)] = append(files[filepath.Dir(path)], f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var insts []instrument
	attrs := map[string]bool{}
	for _, pkg := range files {
		consts := map[string]string{}
		for _, f := range pkg {
			for _, decl := range f.Decls {
				gd, ok := decl.(*ast.GenDecl)
				if !ok || gd.Tok != token.CONST {
					continue
				}
				for _, spec := range gd.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, name := range vs.Names {
						if i < len(vs.Values) {
							if s, ok := stringLit(vs.Values[i]); ok {
								consts[name.Name] = s
							}
							if call, ok := vs.Values[i].(*ast.CallExpr); ok && isSel(call.Fun, "attribute", "Key") && len(call.Args) == 1 {
								if s, ok := stringLit(call.Args[0]); ok {
									attrs[s] = true
								}
							}
						}
					}
				}
			}
		}
		value := func(e ast.Expr) (string, bool) {
			if s, ok := stringLit(e); ok {
				return s, true
			}
			if id, ok := e.(*ast.Ident); ok {
				s, ok := consts[id.Name]
				return s, ok
			}
			return "", false
		}
		for _, f := range pkg {
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				where := fset.Position(call.Pos()).String()
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "attribute" && len(call.Args) > 0 &&
					slices.Contains([]string{"Key", "String", "Bool", "Int", "Int64", "Float64", "StringSlice"}, sel.Sel.Name) {
					if s, ok := value(call.Args[0]); ok {
						attrs[s] = true
					}
					return true
				}
				kind, ok := instrumentKinds[sel.Sel.Name]
				if !ok || len(call.Args) == 0 {
					return true
				}
				name, ok := value(call.Args[0])
				if !ok {
					t.Errorf("%s: %s with a name that is neither a literal nor a constant: this test cannot check it", where, sel.Sel.Name)
					return true
				}
				inst := instrument{name: name, kind: kind, where: where}
				for _, a := range call.Args[1:] {
					if opt, ok := a.(*ast.CallExpr); ok && isSel(opt.Fun, "metric", "WithUnit") && len(opt.Args) == 1 {
						if inst.unit, ok = value(opt.Args[0]); !ok {
							t.Errorf("%s: the unit of %s is not a constant", where, name)
						}
					}
				}
				insts = append(insts, inst)
				return true
			})
		}
	}
	return insts, attrs
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

func isSel(e ast.Expr, pkg, name string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != name {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == pkg
}

// render returns the Prometheus series names the instruments become on
// /metrics: each is made on a meter provider read by prometheusReader (the
// process's own exporter) and recorded once.
func render(t *testing.T, insts []instrument) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := prometheusReader(reg)
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	m := mp.Meter("github.com/fanout/fanout/cmd/fanout/rules-test")
	ctx := context.Background()
	for _, in := range insts {
		unit := metric.WithUnit(in.unit)
		var err error
		switch in.kind {
		case "counter":
			var c metric.Float64Counter
			if c, err = m.Float64Counter(in.name, unit); err == nil {
				c.Add(ctx, 1)
			}
		case "gauge":
			var g metric.Float64Gauge
			if g, err = m.Float64Gauge(in.name, unit); err == nil {
				g.Record(ctx, 1)
			}
		case "histogram":
			var h metric.Float64Histogram
			if h, err = m.Float64Histogram(in.name, unit); err == nil {
				h.Record(ctx, 1)
			}
		}
		if err != nil {
			t.Fatalf("%s: make %s: %v", in.where, in.name, err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+s] = true
			}
		}
	}
	return names
}

var (
	quotedRE   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	matcherRE  = regexp.MustCompile(`\{[^}]*\}`)
	rangeRE    = regexp.MustCompile(`\[[^\]]*\]`)
	groupingRE = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	labelRE    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	identRE    = regexp.MustCompile(`\b[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promqlWord = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"inf": true, "nan": true, "Inf": true, "NaN": true}
)

// metricsAndLabels returns the series and label names a PromQL expression uses.
func metricsAndLabels(expr string) (metrics, labels []string) {
	for _, m := range matcherRE.FindAllString(quotedRE.ReplaceAllString(expr, `""`), -1) {
		for _, l := range labelRE.FindAllStringSubmatch(m, -1) {
			labels = append(labels, l[1])
		}
	}
	e := matcherRE.ReplaceAllString(quotedRE.ReplaceAllString(expr, `""`), " ")
	for _, g := range groupingRE.FindAllStringSubmatch(e, -1) {
		for _, l := range strings.Split(g[2], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
	}
	e = groupingRE.ReplaceAllString(rangeRE.ReplaceAllString(e, " "), " ")
	for _, id := range identRE.FindAllString(e, -1) {
		if strings.HasSuffix(id, "(") || promqlWord[id] {
			continue // a function or an operator
		}
		metrics = append(metrics, id)
	}
	return metrics, labels
}

// rules is the part of a Prometheus rules file the test reads.
type rules struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

// TestPrometheusRules: every series and fanout label an alert of
// deploy/prometheus/fanout-rules.yaml reads is one the code registers, as
// the process's exporter renders it, so the rules cannot drift from the
// code. The names come from the code itself (every otel instrument and
// attribute key of the module), not from a list kept by hand.
func TestPrometheusRules(t *testing.T) {
	t.Parallel()
	insts, attrs := scanCode(t, "../..")
	if len(insts) < 10 {
		t.Fatalf("found %d instruments in the code; the scan is broken", len(insts))
	}
	series := render(t, insts)
	labels := map[string]bool{}
	for a := range attrs {
		labels[strings.NewReplacer(".", "_", "-", "_").Replace(a)] = true
	}
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rs rules
	if err := yaml.Unmarshal(raw, &rs); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	alerts := 0
	for _, g := range rs.Groups {
		for _, r := range g.Rules {
			alerts++
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("group %s: a rule needs alert, expr, labels.severity and annotations.summary: %+v", g.Name, r)
			}
			ms, ls := metricsAndLabels(r.Expr)
			if len(ms) == 0 {
				t.Errorf("%s: no metric found in %q", r.Alert, r.Expr)
			}
			for _, m := range ms {
				if !series[m] {
					t.Errorf("%s: %s is not a series the code registers", r.Alert, m)
				}
			}
			for _, l := range ls {
				if strings.HasPrefix(l, "fanout_") && !labels[l] {
					t.Errorf("%s: label %s is no attribute key of the code", r.Alert, l)
				}
			}
		}
	}
	if alerts == 0 {
		t.Fatalf("%s has no alerts", rulesFile)
	}
	// The alerts the operators were promised (docs/operations.md "Alerts").
	var names []string
	for _, g := range rs.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
		}
	}
	for _, want := range []string{"FanoutLedgerNotConserved", "FanoutReservationsPastLease", "FanoutEstimatedSpendHigh", "FanoutRunsStale"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s has no alert %s", rulesFile, want)
		}
	}
}

// TestMetricsAndLabels: the expression reader finds what the rules test
// relies on, and nothing else.
func TestMetricsAndLabels(t *testing.T) {
	t.Parallel()
	ms, ls := metricsAndLabels(`sum by (fanout_tenant_id) (rate(a_total{fanout_budget_estimated="true", x=~"a{b}"}[1h]))
		/ on(job) group_left() sum(rate(b_total[5m] offset 1h)) > 0.05 and absent(c) or d_bucket > bool 1`)
	if want := []string{"a_total", "b_total", "c", "d_bucket"}; !slices.Equal(ms, want) {
		t.Errorf("metrics %v, want %v", ms, want)
	}
	if want := []string{"fanout_budget_estimated", "x", "fanout_tenant_id", "job"}; !slices.Equal(ls, want) {
		t.Errorf("labels %v, want %v", ls, want)
	}
}
