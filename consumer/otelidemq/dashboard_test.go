package otelidemq_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemq/idemq/consumer/otelidemq"
)

// dashboardFile is the Grafana dashboard over the metrics of Hook and
// RelayHook, as the OpenTelemetry Prometheus exporter names them.
const dashboardFile = "../../docs/grafana/idemq.json"

// Every query of the Grafana dashboard names only series that the
// Prometheus exporter makes of the instruments Hook and RelayHook create,
// and the dashboard shows throughput, duplicates, retries, dead letters,
// the failures of an outage, the Kafka lag and the relay's backlog.
func TestDashboardNamesExportedMetrics(t *testing.T) {
	exported := exportedSeries(t)
	dash := readDashboard(t, dashboardFile)
	if err := checkDashboard(dash, exported); err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, p := range dash.panels() {
		for _, q := range p.Targets {
			for _, name := range queryMetrics(q.Expr) {
				used[name] = true
			}
		}
	}
	for _, name := range []string{
		"messaging_client_consumed_messages_total",
		"idemq_duplicates_total",
		"idemq_retries_total",
		"idemq_dead_letters_total",
		"idemq_ack_failures_total",
		"idemq_kafka_lag",
		"idemq_outbox_pending",
		"idemq_outbox_oldest_pending_age_seconds",
		"messaging_client_sent_messages_total",
	} {
		if !exported[name] {
			t.Errorf("the exporter does not export %s any more: %v", name, slices.Sorted(mapKeys(exported)))
		}
		if !used[name] {
			t.Errorf("no panel of %s shows %s", dashboardFile, name)
		}
	}
}

// The check fails on a panel whose query names a metric that nothing
// exports, and says which panel and which metric.
func TestDashboardCheckFailsOnUnknownMetric(t *testing.T) {
	exported := exportedSeries(t)
	dash := readDashboard(t, dashboardFile)
	planted := panel{ID: 9999, Title: "Planted", Type: "timeseries",
		Targets: []target{{RefID: "A", Expr: `sum by (idemq_dead_letter_reason) (rate(idemq_dead_letter_total{job="w"}[5m]))`}}}
	planted.GridPos.W, planted.GridPos.H = 12, 8
	dash.Panels = append(dash.Panels, planted)
	err := checkDashboard(dash, exported)
	if err == nil || !strings.Contains(err.Error(), `panel "Planted"`) || !strings.Contains(err.Error(), "idemq_dead_letter_total") {
		t.Fatalf("checkDashboard with a planted panel = %v, want an error naming the panel and idemq_dead_letter_total", err)
	}
	t.Log(err)
}

// exportedSeries returns the names of the series the OpenTelemetry
// Prometheus exporter (default options, as examples/observability uses it)
// makes of every instrument that otelidemq.New and otelidemq.NewRelayHook
// create: each instrument gets one measurement, so that the exporter lists
// it. A histogram stands for its _bucket, _sum and _count series, which
// are returned in place of its family name (which no query can select).
func exportedSeries(t *testing.T) map[string]bool {
	t.Helper()
	series := map[string]bool{}
	// One provider each: both measure messaging.client.operation.duration,
	// which one measurement without attributes each would make one series
	// collected twice.
	for _, create := range []func(otelidemq.Config) error{
		func(cfg otelidemq.Config) error { _, err := otelidemq.New(cfg); return err },
		func(cfg otelidemq.Config) error { _, err := otelidemq.NewRelayHook(cfg); return err },
	} {
		reg := prometheus.NewRegistry()
		exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
		if err != nil {
			t.Fatal(err)
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
		t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
		rec := &measuringProvider{MeterProvider: mp}
		if err := create(otelidemq.Config{MeterProvider: rec}); err != nil {
			t.Fatal(err)
		}
		if len(rec.names) == 0 {
			t.Fatal("otelidemq created no instrument")
		}
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			name := f.GetName()
			if f.GetType().String() != "HISTOGRAM" {
				series[name] = true
				continue
			}
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				series[name+s] = true
			}
		}
		t.Logf("instruments %v", rec.names)
	}
	t.Logf("exported as %v", slices.Sorted(mapKeys(series)))
	return series
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// measuringProvider is a MeterProvider whose meters give every
// instrument created one measurement (an observable one through a
// callback of its own), so that an exporter lists each of them.
type measuringProvider struct {
	metric.MeterProvider
	mu    sync.Mutex
	names []string
}

func (p *measuringProvider) Meter(name string, opts ...metric.MeterOption) metric.Meter {
	return &measuringMeter{Meter: p.MeterProvider.Meter(name, opts...), p: p}
}

type measuringMeter struct {
	metric.Meter
	p *measuringProvider
}

func (m *measuringMeter) created(name string, err error) error {
	if err == nil {
		m.p.mu.Lock()
		m.p.names = append(m.p.names, name)
		m.p.mu.Unlock()
	}
	return err
}

func (m *measuringMeter) observe(name string, inst metric.Observable, f func(metric.Observer), err error) error {
	if err == nil {
		_, err = m.Meter.RegisterCallback(func(_ context.Context, o metric.Observer) error { f(o); return nil }, inst)
	}
	return m.created(name, err)
}

func (m *measuringMeter) Int64Counter(name string, opts ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	c, err := m.Meter.Int64Counter(name, opts...)
	if err == nil {
		c.Add(context.Background(), 1)
	}
	return c, m.created(name, err)
}

func (m *measuringMeter) Float64Counter(name string, opts ...metric.Float64CounterOption) (metric.Float64Counter, error) {
	c, err := m.Meter.Float64Counter(name, opts...)
	if err == nil {
		c.Add(context.Background(), 1)
	}
	return c, m.created(name, err)
}

func (m *measuringMeter) Int64UpDownCounter(name string, opts ...metric.Int64UpDownCounterOption) (metric.Int64UpDownCounter, error) {
	c, err := m.Meter.Int64UpDownCounter(name, opts...)
	if err == nil {
		c.Add(context.Background(), 1)
	}
	return c, m.created(name, err)
}

func (m *measuringMeter) Float64UpDownCounter(name string, opts ...metric.Float64UpDownCounterOption) (metric.Float64UpDownCounter, error) {
	c, err := m.Meter.Float64UpDownCounter(name, opts...)
	if err == nil {
		c.Add(context.Background(), 1)
	}
	return c, m.created(name, err)
}

func (m *measuringMeter) Int64Histogram(name string, opts ...metric.Int64HistogramOption) (metric.Int64Histogram, error) {
	c, err := m.Meter.Int64Histogram(name, opts...)
	if err == nil {
		c.Record(context.Background(), 1)
	}
	return c, m.created(name, err)
}

func (m *measuringMeter) Float64Histogram(name string, opts ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	c, err := m.Meter.Float64Histogram(name, opts...)
	if err == nil {
		c.Record(context.Background(), 1)
	}
	return c, m.created(name, err)
}

func (m *measuringMeter) Int64Gauge(name string, opts ...metric.Int64GaugeOption) (metric.Int64Gauge, error) {
	c, err := m.Meter.Int64Gauge(name, opts...)
	if err == nil {
		c.Record(context.Background(), 1)
	}
	return c, m.created(name, err)
}

func (m *measuringMeter) Float64Gauge(name string, opts ...metric.Float64GaugeOption) (metric.Float64Gauge, error) {
	c, err := m.Meter.Float64Gauge(name, opts...)
	if err == nil {
		c.Record(context.Background(), 1)
	}
	return c, m.created(name, err)
}

func (m *measuringMeter) Int64ObservableCounter(name string, opts ...metric.Int64ObservableCounterOption) (metric.Int64ObservableCounter, error) {
	c, err := m.Meter.Int64ObservableCounter(name, opts...)
	return c, m.observe(name, c, func(o metric.Observer) { o.ObserveInt64(c, 1) }, err)
}

func (m *measuringMeter) Float64ObservableCounter(name string, opts ...metric.Float64ObservableCounterOption) (metric.Float64ObservableCounter, error) {
	c, err := m.Meter.Float64ObservableCounter(name, opts...)
	return c, m.observe(name, c, func(o metric.Observer) { o.ObserveFloat64(c, 1) }, err)
}

func (m *measuringMeter) Int64ObservableUpDownCounter(name string, opts ...metric.Int64ObservableUpDownCounterOption) (metric.Int64ObservableUpDownCounter, error) {
	c, err := m.Meter.Int64ObservableUpDownCounter(name, opts...)
	return c, m.observe(name, c, func(o metric.Observer) { o.ObserveInt64(c, 1) }, err)
}

func (m *measuringMeter) Float64ObservableUpDownCounter(name string, opts ...metric.Float64ObservableUpDownCounterOption) (metric.Float64ObservableUpDownCounter, error) {
	c, err := m.Meter.Float64ObservableUpDownCounter(name, opts...)
	return c, m.observe(name, c, func(o metric.Observer) { o.ObserveFloat64(c, 1) }, err)
}

func (m *measuringMeter) Int64ObservableGauge(name string, opts ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	c, err := m.Meter.Int64ObservableGauge(name, opts...)
	return c, m.observe(name, c, func(o metric.Observer) { o.ObserveInt64(c, 1) }, err)
}

func (m *measuringMeter) Float64ObservableGauge(name string, opts ...metric.Float64ObservableGaugeOption) (metric.Float64ObservableGauge, error) {
	c, err := m.Meter.Float64ObservableGauge(name, opts...)
	return c, m.observe(name, c, func(o metric.Observer) { o.ObserveFloat64(c, 1) }, err)
}

// dashboard is what the check reads of a Grafana dashboard's JSON model.
type dashboard struct {
	Title  string  `json:"title"`
	UID    string  `json:"uid"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID      int                `json:"id"`
	Title   string             `json:"title"`
	Type    string             `json:"type"`
	GridPos struct{ W, H int } `json:"gridPos"`
	Targets []target           `json:"targets"`
	Panels  []panel            `json:"panels"` // a collapsed row's panels
}

type target struct {
	RefID string `json:"refId"`
	Expr  string `json:"expr"`
}

// panels returns the panels, those of collapsed rows included, rows left out.
func (d dashboard) panels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			out = append(out, p)
		}
	}
	walk(d.Panels)
	return out
}

func readDashboard(t *testing.T, path string) dashboard {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return d
}

// checkDashboard returns an error naming every panel that has no title,
// unique id or size, no query, or a query that names a series missing
// from exported.
func checkDashboard(d dashboard, exported map[string]bool) error {
	var problems []string
	if d.Title == "" || d.UID == "" {
		problems = append(problems, "the dashboard has no title or uid")
	}
	ps := d.panels()
	if len(ps) == 0 {
		problems = append(problems, "the dashboard has no panel")
	}
	ids := map[int]bool{}
	for _, p := range ps {
		if p.ID == 0 || ids[p.ID] || p.Title == "" || p.GridPos.W <= 0 || p.GridPos.H <= 0 {
			problems = append(problems, fmt.Sprintf("panel %q (id %d) needs a title, a unique id and a size (gridPos w, h)", p.Title, p.ID))
		}
		ids[p.ID] = true
		if len(p.Targets) == 0 {
			problems = append(problems, fmt.Sprintf("panel %q has no query", p.Title))
		}
		for _, q := range p.Targets {
			names := queryMetrics(q.Expr)
			if len(names) == 0 {
				problems = append(problems, fmt.Sprintf("panel %q query %s names no metric: %s", p.Title, q.RefID, q.Expr))
			}
			for _, name := range names {
				if !exported[name] {
					problems = append(problems, fmt.Sprintf("panel %q query %s names %s, which otelidemq does not export", p.Title, q.RefID, name))
				}
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "\n"))
	}
	return nil
}

var (
	// promStrings, promBraces and promBrackets are a query's string
	// literals, label matchers and range or subquery durations.
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promBraces   = regexp.MustCompile(`\{[^}]*\}`)
	promBrackets = regexp.MustCompile(`\[[^\]]*\]`)
	// promGrouping is a label list: by (...), without (...), on (...),
	// ignoring (...), group_left (...), group_right (...).
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	promKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
		"group_right": true, "bool": true, "and": true, "or": true, "unless": true, "offset": true,
		"inf": true, "nan": true, "Inf": true, "NaN": true}
)

// queryMetrics returns the metric names of a PromQL query: its identifiers
// once strings, label matchers, durations, grouping label lists, Grafana
// variables ($name), function calls, keywords and numbers are taken out.
func queryMetrics(expr string) []string {
	s := promStrings.ReplaceAllString(expr, " ")
	s = promBraces.ReplaceAllString(s, " ")
	s = promBrackets.ReplaceAllString(s, " ")
	s = promGrouping.ReplaceAllString(s, " ")
	s = regexp.MustCompile(`\$\{?\w+\}?`).ReplaceAllString(s, " ")
	s = regexp.MustCompile(`\b[0-9][0-9.eE+\-]*\b`).ReplaceAllString(s, " ")
	var names []string
	for _, m := range promIdent.FindAllStringSubmatch(s, -1) {
		if m[1] != "" { // a function
			continue
		}
		name := m[0]
		if promKeywords[name] || slices.Contains(names, name) {
			continue
		}
		names = append(names, name)
	}
	return names
}
