package integration

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// The Grafana dashboard and the alert rules name metrics, labels and label values; each
// must be one the binaries serve, or a panel shows nothing and an alert never fires. The
// expressions are parsed with Prometheus's own parser.

const (
	dashboardFile = "../deployments/grafana/dispatch.json"
	rulesFile     = "../deployments/prometheus/rules.yml"
)

// served is what the binaries' /metrics pages hold: metric name -> label -> values.
type served map[string]map[string]map[string]bool

var sampleLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// servedBy reads scrapes ("name{labels}" -> value) into what they serve.
func servedBy(scrapes ...map[string]float64) served {
	s := served{}
	for _, m := range scrapes {
		for key := range m {
			name, rest, _ := strings.Cut(key, "{")
			if s[name] == nil {
				s[name] = map[string]map[string]bool{}
			}
			for _, l := range sampleLabel.FindAllStringSubmatch(rest, -1) {
				if s[name][l[1]] == nil {
					s[name][l[1]] = map[string]bool{}
				}
				s[name][l[1]][l[2]] = true
			}
		}
	}
	return s
}

// scrapeLabels are added by Prometheus to every series it scrapes; up is its own.
var scrapeLabels = map[string]bool{"instance": true, "job": true}

// grafanaVars stands for the dashboard's variables where PromQL has values.
var grafanaVars = strings.NewReplacer("$__rate_interval", "1m", "$__range", "1h", "$__interval", "1m", "$instance", ".*")

// dashboardExprs is every query of the dashboard, by panel title.
func dashboardExprs(t *testing.T) map[string][]string {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	out := map[string][]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out["panel "+p.Title] = append(out["panel "+p.Title], grafanaVars.Replace(tg.Expr))
		}
	}
	return out
}

// ruleExprs is every alert's expression, by alert name.
func ruleExprs(t *testing.T) map[string][]string {
	t.Helper()
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	out := map[string][]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out["alert "+r.Alert] = append(out["alert "+r.Alert], r.Expr)
		}
	}
	return out
}

// checkPromQL parses each expression and reports every metric, label or label value it
// names that the binaries do not serve.
func checkPromQL(t *testing.T, s served, exprs map[string][]string) {
	t.Helper()
	if len(exprs) == 0 {
		t.Fatal("no expressions to check")
	}
	for where, es := range exprs {
		for _, e := range es {
			expr, err := parser.NewParser(parser.Options{}).ParseExpr(e)
			if err != nil {
				t.Errorf("%s: %q does not parse: %v", where, e, err)
				continue
			}
			used := map[string]bool{} // labels of the metrics it reads, for its groupings
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				if vs, ok := n.(*parser.VectorSelector); ok {
					checkSelector(t, s, where, vs, used)
				}
				return nil
			})
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				if ag, ok := n.(*parser.AggregateExpr); ok {
					for _, l := range ag.Grouping {
						if !used[l] && !scrapeLabels[l] {
							t.Errorf("%s: %q groups by %q, a label none of its metrics has", where, e, l)
						}
					}
				}
				return nil
			})
		}
	}
}

func checkSelector(t *testing.T, s served, where string, vs *parser.VectorSelector, used map[string]bool) {
	t.Helper()
	if vs.Name == "up" { // Prometheus's own, per target
		return
	}
	m, ok := s[vs.Name]
	if !ok {
		t.Errorf("%s: %s is not a metric the binaries serve", where, vs.Name)
		return
	}
	for l := range m {
		used[l] = true
	}
	for _, lm := range vs.LabelMatchers {
		if lm.Name == model.MetricNameLabel || scrapeLabels[lm.Name] {
			continue
		}
		values, ok := m[lm.Name]
		if !ok {
			t.Errorf("%s: %s has no label %q", where, vs.Name, lm.Name)
			continue
		}
		// A value, or alternatives of plain values: each must be one the metric has.
		var wants []string
		switch lm.Type {
		case labels.MatchEqual, labels.MatchNotEqual:
			wants = []string{lm.Value}
		case labels.MatchRegexp, labels.MatchNotRegexp:
			if !strings.ContainsAny(lm.Value, `.*+?()[]{}^$\`) {
				wants = strings.Split(lm.Value, "|")
			}
		}
		for _, w := range wants {
			if !values[w] {
				have := make([]string, 0, len(values))
				for v := range values {
					have = append(have, v)
				}
				slices.Sort(have)
				t.Errorf("%s: %s{%s} names the value %q, which it never has (it has %v)", where, vs.Name, lm.Name, w, have)
			}
		}
	}
}
