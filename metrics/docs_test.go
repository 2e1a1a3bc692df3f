package inboxmetrics_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v2"

	"github.com/watermill-inbox/inbox/internal/readme"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/metrics"
	"github.com/watermill-inbox/inbox/middleware"
)

// The blocks of docs/operating.md, as an operator would use them, with
// the paths they name pointed at this repository's files: Prometheus's
// configuration (the scrape jobs and the rule file) passes promtool check
// config, which also checks the rules; the command that checks the rules
// runs; Grafana's dashboard provider is a provisioning file of one file
// provider.
func TestDocs_operating_blocks(t *testing.T) {
	t.Parallel()
	promtool := testenv.Program(t, "promtool", howToPrometheus)
	dir := t.TempDir()
	rules, err := filepath.Abs("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "inboxd-token")
	if err := os.WriteFile(secret, []byte("a-token-of-at-least-16-bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	paths := strings.NewReplacer(
		"/etc/prometheus/rules/watermill-inbox.yml", rules,
		"/run/secrets/inboxd-token", secret,
	)
	var config []string
	seen := map[string]bool{}
	for _, b := range readme.RunBy(t) {
		text := paths.Replace(b.Text)
		switch {
		case b.Lang == "yaml" && (strings.Contains(text, "scrape_configs:") || strings.Contains(text, "rule_files:")):
			config = append(config, text)
			seen["prometheus"] = true
		case b.Lang == "sh":
			words := strings.Fields(text)
			if len(words) < 1 || words[0] != "promtool" {
				t.Fatalf("%s:%d: %q is not a promtool command", b.File, b.Line, text)
			}
			if out, err := exec.Command(promtool, words[1:]...).CombinedOutput(); err != nil {
				t.Errorf("%s:%d: %s: %v\n%s", b.File, b.Line, text, err, out)
			}
			seen["promtool"] = true
		case b.Lang == "yaml" && strings.Contains(text, "providers:"):
			var p struct {
				APIVersion int `yaml:"apiVersion"`
				Providers  []struct {
					Name    string            `yaml:"name"`
					Type    string            `yaml:"type"`
					Options map[string]string `yaml:"options"`
				} `yaml:"providers"`
			}
			if err := yaml.UnmarshalStrict([]byte(text), &p); err != nil {
				t.Errorf("%s:%d: Grafana's provisioning file: %v", b.File, b.Line, err)
			} else if p.APIVersion != 1 || len(p.Providers) != 1 || p.Providers[0].Type != "file" || p.Providers[0].Options["path"] == "" {
				t.Errorf("%s:%d: Grafana's provisioning file %+v: want apiVersion 1 and one file provider with a path", b.File, b.Line, p)
			}
			seen["grafana"] = true
		default:
			t.Errorf("%s:%d: a block this test does not know how to run", b.File, b.Line)
		}
	}
	for _, k := range []string{"prometheus", "promtool", "grafana"} {
		if !seen[k] {
			t.Errorf("docs/operating.md has no %s block for this test", k)
		}
	}
	file := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(file, []byte(strings.Join(config, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "config", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check config of docs/operating.md's configuration: %v\n%s", err, out)
	}
}

// alertRules returns the alert rules of alerts.yml: name -> expression.
func alertRules(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out[r.Alert] = r.Expr
		}
	}
	if len(out) < 10 {
		t.Fatalf("alerts.yml: %d alert rules found, want at least 10: is the parser still finding them?", len(out))
	}
	return out
}

// Each alert's row in docs/operating.md's table names the labels the alert
// carries (besides severity): those of its expression's by clauses, and
// those that the alert has in its promtool tests (alerts_test.yml, where
// promtool checks them). A row that says the alert keeps "the labels given
// to" a function names some of them: its expression aggregates nothing,
// so that every label of the series is the alert's.
func TestDocs_operating_alert_labels(t *testing.T) {
	t.Parallel()
	rules := alertRules(t)
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(Inbox\\w+)` \\|(.*)$")
	ident := regexp.MustCompile("`([a-z_]+)`")
	cells := map[string]string{} // alert -> its labels cell
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		c := strings.Split(m[2], "|")
		if len(c) != 4 { // fires when, labels, first look, and the row's end
			t.Errorf("docs/operating.md: the row of %s has %d cells, want 4 (alert, fires when, labels, first look)", m[1], len(c))
			continue
		}
		cells[m[1]] = c[1]
	}
	raw, err := os.ReadFile("alerts_test.yml")
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []struct {
					ExpLabels map[string]string `yaml:"exp_labels"`
				} `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(raw, &tests); err != nil {
		t.Fatal(err)
	}
	tested := map[string]map[string]bool{} // alert -> labels of its firing tests
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			for _, e := range a.ExpAlerts {
				if tested[a.Alertname] == nil {
					tested[a.Alertname] = map[string]bool{}
				}
				for l := range e.ExpLabels {
					if l != "severity" {
						tested[a.Alertname][l] = true
					}
				}
			}
		}
	}
	set := func(ls []string) string {
		slices.Sort(ls)
		return strings.Join(slices.Compact(ls), ", ")
	}
	for name, expr := range rules {
		cell, ok := cells[name]
		if !ok {
			t.Errorf("docs/operating.md's table of alerts has no row for %s", name)
			continue
		}
		var doc []string
		for _, m := range ident.FindAllStringSubmatch(cell, -1) {
			doc = append(doc, m[1])
		}
		keeps := strings.Contains(cell, "labels given to")
		var firing []string
		for l := range tested[name] {
			firing = append(firing, l)
		}
		if len(firing) == 0 {
			t.Errorf("%s: alerts_test.yml has no test where it fires, with its labels", name)
			continue
		}
		by := set(grouping(expr))
		switch {
		case len(doc) == 0:
			t.Errorf("docs/operating.md: the row of %s names no label", name)
		case keeps && by != "":
			t.Errorf("docs/operating.md: %s keeps the labels of its series, says its row, but its expression aggregates by (%s)", name, by)
		case keeps:
			for _, l := range doc {
				if !tested[name][l] {
					t.Errorf("docs/operating.md: %s carries %s, says its row; its tests (alerts_test.yml) find %s", name, l, set(firing))
				}
			}
		case set(doc) != by:
			t.Errorf("docs/operating.md: %s carries %s, says its row; its expression aggregates by (%s)", name, set(doc), by)
		case set(doc) != set(firing):
			t.Errorf("docs/operating.md: %s carries %s, says its row; its tests (alerts_test.yml) find %s", name, set(doc), set(firing))
		}
	}
	for name := range cells {
		if _, ok := rules[name]; !ok {
			t.Errorf("docs/operating.md's table of alerts has a row for %s, which alerts.yml does not define", name)
		}
	}
}

// dashboardTargets returns the queries of dashboard.json's panels as
// written (Grafana's variables in them), by panel title.
func dashboardTargets(t *testing.T) map[string][]string {
	t.Helper()
	raw, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []panel `json:"panels"`
	}
	var d struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out[p.Title] = append(out[p.Title], tg.Expr)
			}
			walk(p.Panels) // a collapsed row's
		}
	}
	walk(d.Panels)
	if len(out) < 10 {
		t.Fatalf("dashboard.json: %d panels with queries found, want at least 10: is the parser still finding them?", len(out))
	}
	return out
}

// The dashboard's panel "Outcomes that need a look" shows the outcomes the
// alert rules watch, as docs/operating.md says: those their expressions
// select (outcome="..."), no other.
func TestDashboard_panel_of_alerted_outcomes(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(strings.Fields(string(doc)), " "), "the outcomes the alerts watch") {
		t.Fatal(`docs/operating.md no longer says the dashboard shows "the outcomes the alerts watch": update this test`)
	}
	var alerted []string
	for _, expr := range alertRules(t) {
		for _, m := range regexp.MustCompile(`outcome="(\w+)"`).FindAllStringSubmatch(expr, -1) {
			alerted = append(alerted, m[1])
		}
	}
	queries := dashboardTargets(t)["Outcomes that need a look"]
	if len(queries) != 1 {
		t.Fatalf("dashboard.json: panel \"Outcomes that need a look\" has %d queries, want 1", len(queries))
	}
	m := regexp.MustCompile(`outcome=~"([\w|]+)"`).FindStringSubmatch(queries[0])
	if m == nil {
		t.Fatalf("dashboard.json: panel \"Outcomes that need a look\" selects no outcome=~\"...\": %s", queries[0])
	}
	shown := strings.Split(m[1], "|")
	slices.Sort(alerted)
	slices.Sort(shown)
	if alerted = slices.Compact(alerted); !slices.Equal(slices.Compact(shown), alerted) {
		t.Errorf("dashboard.json: panel \"Outcomes that need a look\" shows the outcomes %v; the alert rules watch %v", shown, alerted)
	}
}

// The dashboard's variables filter its panels as docs/operating.md says:
// Bus and Group every query of the middleware's series, Handler those
// whose series carry handler_name, and no other (a store call has no
// handler_name: $handler there would pretend to filter).
func TestDashboard_variables_filter_what_docs_say(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(strings.Fields(string(doc)), " "),
		"The variables Bus and Group filter the middleware's panels, and Handler those whose series carry `handler_name`") {
		t.Fatal("docs/operating.md no longer says which panels the variables filter in the words this test checks: update it")
	}
	// The middleware's series, and whether they carry handler_name.
	reg := prometheus.NewRegistry()
	m, err := inboxmetrics.NewPrometheus(inboxmetrics.PrometheusConfig{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	m.Outcome("charge", inboxmw.OutcomeProcessed)
	m.StoreCall(inboxmw.OpTryBegin, time.Millisecond, nil)
	m.Waited("charge", inboxmw.WaitBusy, time.Millisecond)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byHandler := map[string]bool{} // metric name (a histogram's _bucket and _count too) -> has handler_name
	for _, mf := range mfs {
		has := false
		for _, l := range mf.GetMetric()[0].GetLabel() {
			has = has || l.GetName() == "handler_name"
		}
		for _, suffix := range []string{"", "_bucket", "_count", "_sum"} {
			byHandler[mf.GetName()+suffix] = has
		}
	}
	if len(byHandler) < 12 {
		t.Fatalf("%d middleware series names found, want at least 12", len(byHandler))
	}
	checked := 0
	for title, queries := range dashboardTargets(t) {
		for _, q := range queries {
			for _, s := range selectors(q) {
				has, ok := byHandler[s.metric]
				if !ok {
					continue // not the middleware's (inboxd's)
				}
				checked++
				sel := regexp.MustCompile(regexp.QuoteMeta(s.metric) + `\{([^}]*)\}`).FindStringSubmatch(q)
				if sel == nil {
					t.Errorf("panel %q: %s without matchers: %s", title, s.metric, q)
					continue
				}
				for _, v := range []string{`bus=~"$bus"`, `group=~"$group"`} {
					if !strings.Contains(sel[1], v) {
						t.Errorf("panel %q: %s is not filtered by %s: %s", title, s.metric, v, q)
					}
				}
				if filtered := strings.Contains(sel[1], "$handler"); filtered != has {
					t.Errorf("panel %q: %s (handler_name: %v) filtered by $handler: %v: %s", title, s.metric, has, filtered, q)
				}
			}
		}
	}
	if checked < 8 {
		t.Fatalf("%d queries of the middleware's series checked, want at least 8: is the parser still finding them?", checked)
	}
}
