// Command promql reads every PromQL expression of Coxswain's Grafana dashboards and
// PrometheusRules (config/monitoring) with Prometheus' own parser and engine.
//
//	promql names FILE...
//	    prints, as JSON, each expression with where it is and the metric names it selects;
//	    fails when one does not parse.
//	promql eval [-scrapes N] [-interval D] -target JOB=URL... FILE...
//	    scrapes each /metrics URL N times, D apart, into an in-memory TSDB (labels job and
//	    instance), evaluates every dashboard panel's query at the last scrape, prints how many
//	    series each returned, and fails when one returned none. Alert expressions are
//	    evaluated too and reported as firing or not (an alert that is quiet has no data, as it
//	    should).
//
// Test tooling only: run against a local cluster's Pods (make demo), never a network address.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/tsdb"
	"sigs.k8s.io/yaml"
)

// Expression is one PromQL expression and where it was found.
type Expression struct {
	// File, and the panel title or alert name.
	Source string `json:"source"`
	Expr   string `json:"expr"`
	// Alert expressions are quiet (no data) while nothing is wrong.
	Alert   bool     `json:"alert"`
	Metrics []string `json:"metrics"`
}

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: promql names FILE... | promql eval -target JOB=URL... FILE..."))
	}
	var err error
	switch os.Args[1] {
	case "names":
		err = names(os.Args[2:])
	case "eval":
		err = eval(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (names, eval)", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "promql:", err)
	os.Exit(1)
}

func newParser() parser.Parser {
	return parser.NewParser(parser.Options{})
}

// expressions reads every expression of the files: Grafana dashboards (.json: panels'
// targets, rows included) and PrometheusRules (.yaml: spec.groups[].rules[].expr).
func expressions(files []string) ([]Expression, error) {
	var out []Expression
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		base := filepath.Base(file)
		switch {
		case strings.HasSuffix(file, ".json"):
			var dash struct {
				Panels []panel `json:"panels"`
			}
			if err := json.Unmarshal(data, &dash); err != nil {
				return nil, fmt.Errorf("%s: %w", file, err)
			}
			var walk func([]panel)
			walk = func(ps []panel) {
				for _, p := range ps {
					for _, t := range p.Targets {
						out = append(out, Expression{Source: base + ": " + p.Title, Expr: t.Expr})
					}
					walk(p.Panels)
				}
			}
			walk(dash.Panels)
		case strings.HasSuffix(file, ".yaml"):
			var rule struct {
				Kind string `json:"kind"`
				Spec struct {
					Groups []struct {
						Rules []struct {
							Alert  string `json:"alert"`
							Record string `json:"record"`
							Expr   string `json:"expr"`
						} `json:"rules"`
					} `json:"groups"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal(data, &rule); err != nil {
				return nil, fmt.Errorf("%s: %w", file, err)
			}
			if rule.Kind != "PrometheusRule" {
				continue
			}
			for _, g := range rule.Spec.Groups {
				for _, r := range g.Rules {
					name := r.Alert + r.Record
					out = append(out, Expression{Source: base + ": " + name, Expr: r.Expr, Alert: r.Alert != ""})
				}
			}
		}
	}
	p := newParser()
	for i := range out {
		if strings.TrimSpace(out[i].Expr) == "" {
			return nil, fmt.Errorf("%s: empty expression", out[i].Source)
		}
		expr, err := p.ParseExpr(out[i].Expr)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", out[i].Source, out[i].Expr, err)
		}
		seen := map[string]bool{}
		parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
			if vs, ok := node.(*parser.VectorSelector); ok {
				name := vs.Name
				for _, m := range vs.LabelMatchers {
					if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
						name = m.Value
					}
				}
				if name == "" {
					return fmt.Errorf("a selector without a metric name: %s", vs)
				}
				seen[name] = true
			}
			return nil
		})
		out[i].Metrics = make([]string, 0, len(seen))
		for n := range seen {
			out[i].Metrics = append(out[i].Metrics, n)
		}
		sort.Strings(out[i].Metrics)
	}
	return out, nil
}

type panel struct {
	Title   string  `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

func names(files []string) error {
	exprs, err := expressions(files)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(exprs)
}

type targets []string

func (t *targets) String() string     { return strings.Join(*t, ",") }
func (t *targets) Set(v string) error { *t = append(*t, v); return nil }

func eval(args []string) error {
	fs := flag.NewFlagSet("eval", flag.ContinueOnError)
	scrapes := fs.Int("scrapes", 4, "scrapes of each target")
	interval := fs.Duration("interval", 3*time.Second, "time between scrapes")
	var tgts targets
	fs.Var(&tgts, "target", "JOB=URL of a /metrics endpoint (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(tgts) == 0 || fs.NArg() == 0 {
		return errors.New("eval needs -target JOB=URL and files")
	}
	exprs, err := expressions(fs.Args())
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "coxswain-promql-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := tsdb.Open(dir, nil, nil, tsdb.DefaultOptions(), nil)
	if err != nil {
		return err
	}
	defer db.Close()

	ctx := context.Background()
	client := &http.Client{Timeout: 5 * time.Second}
	var last time.Time
	for i := 0; i < *scrapes; i++ {
		if i > 0 {
			time.Sleep(*interval)
		}
		last = time.Now()
		app := db.Appender(ctx)
		for _, t := range tgts {
			job, url, ok := strings.Cut(t, "=")
			if !ok {
				return fmt.Errorf("target %q is not JOB=URL", t)
			}
			n, err := scrape(ctx, client, url, func(ls labels.Labels, v float64) error {
				b := labels.NewBuilder(ls)
				b.Set("job", job)
				b.Set("instance", url)
				_, err := app.Append(0, b.Labels(), last.UnixMilli(), v)
				return err
			})
			if err != nil {
				_ = app.Rollback()
				return fmt.Errorf("scraping %s: %w", url, err)
			}
			if i == 0 {
				fmt.Printf("scraped %-10s %s: %d series\n", job, url, n)
			}
		}
		if err := app.Commit(); err != nil {
			return err
		}
	}

	engine := promql.NewEngine(promql.EngineOpts{
		MaxSamples:    5_000_000,
		Timeout:       time.Minute,
		LookbackDelta: 5 * time.Minute,
		Parser:        newParser(),
	})
	var empty []string
	panels, firing := 0, 0
	for _, e := range exprs {
		q, err := engine.NewInstantQuery(ctx, db, nil, e.Expr, last)
		if err != nil {
			return fmt.Errorf("%s: %w", e.Source, err)
		}
		res := q.Exec(ctx)
		if res.Err != nil {
			return fmt.Errorf("%s: %w", e.Source, res.Err)
		}
		n, sample := count(res.Value)
		q.Close()
		if e.Alert {
			state := "quiet"
			if n > 0 {
				state = "FIRING"
				firing++
			}
			fmt.Printf("alert %-6s %s\n", state, e.Source)
			continue
		}
		panels++
		fmt.Printf("panel %3d series  e.g. %-12s %s\n", n, sample, e.Source)
		if n == 0 {
			empty = append(empty, e.Source+": "+e.Expr)
		}
	}
	fmt.Printf("%d panel queries, %d with data; %d alerts firing\n", panels, panels-len(empty), firing)
	if len(empty) > 0 {
		return fmt.Errorf("queries without data:\n  %s", strings.Join(empty, "\n  "))
	}
	return nil
}

// count returns the number of series in a result and one value to show.
func count(v interface{ Type() parser.ValueType }) (int, string) {
	show := func(f float64) string {
		if math.IsNaN(f) {
			return "NaN"
		}
		return fmt.Sprintf("%.4g", f)
	}
	switch r := v.(type) {
	case promql.Vector:
		if len(r) == 0 {
			return 0, "-"
		}
		return len(r), show(r[0].F)
	case promql.Scalar:
		return 1, show(r.V)
	case promql.Matrix:
		return len(r), "(range)"
	}
	return 0, "-"
}

// scrape reads one Prometheus text exposition and calls add for every sample: histograms as
// their _bucket (with le), _sum and _count series, as Prometheus stores them.
func scrape(ctx context.Context, client *http.Client, url string, add func(labels.Labels, float64) error) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %s", resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		return 0, err
	}
	n := 0
	emit := func(name string, m *dto.Metric, extra map[string]string, v float64) error {
		b := labels.NewBuilder(labels.EmptyLabels())
		b.Set(labels.MetricName, name)
		for _, lp := range m.GetLabel() {
			b.Set(lp.GetName(), lp.GetValue())
		}
		for k, val := range extra {
			b.Set(k, val)
		}
		n++
		return add(b.Labels(), v)
	}
	for name, fam := range families {
		for _, m := range fam.GetMetric() {
			var err error
			switch fam.GetType() {
			case dto.MetricType_COUNTER:
				err = emit(name, m, nil, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				err = emit(name, m, nil, m.GetGauge().GetValue())
			case dto.MetricType_UNTYPED:
				err = emit(name, m, nil, m.GetUntyped().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					le := fmt.Sprint(b.GetUpperBound())
					if math.IsInf(b.GetUpperBound(), 1) {
						le = "+Inf"
					}
					if err = emit(name+"_bucket", m, map[string]string{"le": le}, float64(b.GetCumulativeCount())); err != nil {
						break
					}
				}
				if err == nil {
					// The +Inf bucket is implicit in the parsed form when it equals the count.
					if !hasInf(h) {
						err = emit(name+"_bucket", m, map[string]string{"le": "+Inf"}, float64(h.GetSampleCount()))
					}
				}
				if err == nil {
					err = emit(name+"_sum", m, nil, h.GetSampleSum())
				}
				if err == nil {
					err = emit(name+"_count", m, nil, float64(h.GetSampleCount()))
				}
			default:
				err = fmt.Errorf("%s: metric type %s is not read by this tool", name, fam.GetType())
			}
			if err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

func hasInf(h *dto.Histogram) bool {
	for _, b := range h.GetBucket() {
		if math.IsInf(b.GetUpperBound(), 1) {
			return true
		}
	}
	return false
}
