// Command dashboard writes the Grafana dashboard of watermill-inbox,
// metrics/dashboard.json, with the Grafana foundation SDK. It is a module
// of its own, so that the SDK never enters the build of a program that uses
// the library. Regenerate the JSON after changing this file:
//
//	cd metrics/dashboard && go generate
//
// TestDashboardJSON_is_generated fails while the checked-in JSON differs
// from what this program writes. The queries name the series of package
// inboxmetrics (default namespace watermill) and of inboxd; the test
// TestPrometheus_dashboard_and_alerts (package inboxmetrics) runs each of
// them against a real Prometheus.
package main

//go:generate go run . -o ../dashboard.json

// The SDK marks its builder of Grafana's classic dashboard JSON model
// deprecated in favour of dashboardv2, the schema v2 that only recent
// Grafana versions import, with it enabled. The classic model imports into
// every Grafana, so it stays.
//lint:file-ignore SA1019 the classic dashboard model is what every Grafana imports

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

func main() {
	out := flag.String("o", "", "write the dashboard to this `file` (default standard output)")
	flag.Parse()
	b, err := dashboardJSON()
	if err == nil {
		if *out == "" {
			_, err = os.Stdout.Write(b)
		} else {
			err = os.WriteFile(*out, b, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}

// inbox selects the middleware's series of the bus, group and handler the
// dashboard's variables choose; group selects those of the bus and group
// (store calls are not by handler).
const (
	inbox = `bus=~"$bus", group=~"$group", handler_name=~"$handler"`
	group = `bus=~"$bus", group=~"$group"`
)

// alertedOutcomes are the outcomes that alert rules of metrics/alerts.yml
// watch, as a regular expression (TestDashboard_panel_of_alerted_outcomes,
// package inboxmetrics, holds it to the file).
const alertedOutcomes = "dead|lease_lost|complete_failed|fail_open|redelivery_failed|stale"

// dashboardJSON returns the dashboard as the file holds it: indented JSON
// ending in a newline.
func dashboardJSON() ([]byte, error) {
	d, err := build().Build()
	if err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func build() *dashboard.DashboardBuilder {
	var ids uint32 // each panel's and row's, in order
	row := func(title string) *dashboard.RowBuilder {
		ids++
		return dashboard.NewRowBuilder(title).Id(ids)
	}
	panel := func(title, unit, description string, queries ...*prometheus.DataqueryBuilder) *timeseries.PanelBuilder {
		ids++
		return timeseriesPanel(title, unit, description, queries...).Id(ids)
	}
	return dashboard.NewDashboardBuilder("Watermill inbox").
		Uid("watermill-inbox").
		Description("Messages, store calls, waits and redeliveries of the watermill-inbox middleware (package inboxmetrics), and the inboxd server. Alert rules: metrics/alerts.yml.").
		Tags([]string{"watermill", "inbox"}).
		Refresh("30s").
		Time("now-1h", "now").
		Timezone(common.TimeZoneBrowser).
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus")).
		WithVariable(labelVariable("bus", "Bus", `label_values(watermill_inbox_messages_total, bus)`)).
		WithVariable(labelVariable("group", "Group", `label_values(watermill_inbox_messages_total{bus=~"$bus"}, group)`)).
		WithVariable(labelVariable("handler", "Handler", `label_values(watermill_inbox_messages_total{bus=~"$bus", group=~"$group"}, handler_name)`)).
		WithRow(row("Messages")).
		WithPanel(panel("Outcomes by handler", "ops",
			"Messages a second by handler and outcome: processed, duplicate (acked without the handler), busy, dead, and the rest (package inboxmetrics lists them).",
			query(`sum by (handler_name, outcome) (rate(watermill_inbox_messages_total{`+inbox+`}[$__rate_interval]))`, "{{handler_name}} {{outcome}}"))).
		WithPanel(panel("Duplicates and dead keys", "ops",
			"Duplicates: deliveries of a processed key, acked without running the handler. Dead: deliveries refused because their key is dead (MaxAttempts); inboxctl ls -state dead lists those keys.",
			query(`sum by (handler_name, outcome) (rate(watermill_inbox_messages_total{`+inbox+`, outcome=~"duplicate|dead"}[$__rate_interval]))`, "{{handler_name}} {{outcome}}"))).
		WithPanel(panel("Outcomes that need a look", "ops",
			"The outcomes the alert rules (metrics/alerts.yml) watch: deliveries refused for a dead key, leases lost, marks that failed, claims that failed open, hand-offs to the broker that failed, stale messages.",
			query(`sum by (handler_name, outcome) (rate(watermill_inbox_messages_total{`+inbox+`, outcome=~"`+alertedOutcomes+`"}[$__rate_interval]))`, "{{handler_name}} {{outcome}}"))).
		WithPanel(panel("Marks retried", "ops",
			"Marks (Complete) that failed and are retried in the background (complete_retry), and those that failed until the lease ended (complete_failed): their next delivery runs the handler again.",
			query(`sum by (handler_name, outcome) (rate(watermill_inbox_messages_total{`+inbox+`, outcome=~"complete_retry|complete_failed"}[$__rate_interval]))`, "{{handler_name}} {{outcome}}"))).
		WithRow(row("Store calls")).
		WithPanel(panel("Store call latency by store call", "s",
			"Quantiles of the store calls' durations by call (op): try_begin, complete, release, fail, extend, and redeliver (the hand-off of a failed attempt to the broker).",
			query(`histogram_quantile(0.5, sum by (le, op) (rate(watermill_inbox_store_call_duration_seconds_bucket{`+group+`}[$__rate_interval])))`, "{{op}} p50"),
			query(`histogram_quantile(0.99, sum by (le, op) (rate(watermill_inbox_store_call_duration_seconds_bucket{`+group+`}[$__rate_interval])))`, "{{op}} p99"))).
		WithPanel(panel("Store calls by result", "ops",
			"Store calls a second by call (op) and result (ok or error).",
			query(`sum by (op, result) (rate(watermill_inbox_store_call_duration_seconds_count{`+group+`}[$__rate_interval]))`, "{{op}} {{result}}"))).
		WithPanel(panel("Store server: keys evicted", "ops",
			"Keys a second the store's server (Redis) evicts to stay within its maxmemory: each processed key evicted is a message that runs again if it is delivered again (alert InboxStoreEvicting).",
			query(`sum by (instance) (rate(watermill_inbox_store_evicted_keys_total[$__rate_interval]))`, "{{instance}}"))).
		WithPanel(panel("Store server: memory headroom", "bytes",
			"Memory the store's server (Redis) has left before its maxmemory (alert InboxStoreMemoryLow under a tenth of it).",
			query(`min by (instance) (min_over_time(watermill_inbox_store_memory_headroom_bytes[$__rate_interval]))`, "{{instance}}"))).
		WithRow(row("Waits and redeliveries")).
		WithPanel(panel("Waits in the consumer", "s",
			"Seconds waited a second, by handler and reason: on a key another consumer holds or that waits out a failed attempt's backoff (busy), or between the claims of a failing store (store_backoff). 1 s/s is one message waiting all the time.",
			query(`sum by (handler_name, reason) (rate(watermill_inbox_wait_seconds_total{`+inbox+`}[$__rate_interval]))`, "{{handler_name}} {{reason}}"))).
		WithPanel(panel("Redeliveries", "ops",
			"Failed attempts handed to the broker's redelivery (Config.Redelivery), which holds their backoff (redelivered), messages waiting behind an earlier one of their order key (Config.OrderKey), handed off or nacked (behind), and hand-offs that failed (redelivery_failed): those messages wait out their backoff in the consumer.",
			query(`sum by (handler_name, outcome) (rate(watermill_inbox_messages_total{`+inbox+`, outcome=~"redelivered|behind|redelivery_failed"}[$__rate_interval]))`, "{{handler_name}} {{outcome}}"))).
		WithRow(row("inboxd")).
		WithPanel(panel("inboxd requests by endpoint and status", "reqps",
			"Answers of inboxd a second by endpoint and status: the v1 status of a 200 (Acquired, Processed, Busy, ...) or the error code (unauthorized, store_unavailable, ...).",
			query(`sum by (endpoint, status) (rate(inbox_server_requests_total[$__rate_interval]))`, "{{endpoint}} {{status}}"))).
		WithPanel(panel("inboxd errors", "reqps",
			"Answers of inboxd that are not 2xx, by endpoint and error code.",
			query(`sum by (endpoint, status) (rate(inbox_server_requests_total{code!~"2.."}[$__rate_interval]))`, "{{endpoint}} {{status}}"))).
		WithPanel(panel("inboxd latency by endpoint", "s",
			"Quantiles of the time inboxd takes to answer, by endpoint.",
			query(`histogram_quantile(0.5, sum by (le, endpoint) (rate(inbox_server_request_duration_seconds_bucket[$__rate_interval])))`, "{{endpoint}} p50"),
			query(`histogram_quantile(0.99, sum by (le, endpoint) (rate(inbox_server_request_duration_seconds_bucket[$__rate_interval])))`, "{{endpoint}} p99")))
}

// datasource is the data source the dashboard's variable chooses.
func datasource() common.DataSourceRef {
	typ, uid := "prometheus", "${datasource}"
	return common.DataSourceRef{Type: &typ, Uid: &uid}
}

// labelVariable is a variable of the values of a label, several or all of
// them selectable, all by default.
func labelVariable(name, label, q string) *dashboard.QueryVariableBuilder {
	all, allValue := "All", "$__all"
	return dashboard.NewQueryVariableBuilder(name).
		Label(label).
		Query(dashboard.StringOrMap{String: &q}).
		Datasource(datasource()).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
		Sort(dashboard.VariableSortAlphabeticalAsc).
		Multi(true).
		IncludeAll(true).
		AllValue(".*").
		Current(dashboard.VariableOption{Text: dashboard.StringOrArrayOfString{String: &all}, Value: dashboard.StringOrArrayOfString{String: &allValue}})
}

// timeseriesPanel is a time series panel, half the dashboard's width.
func timeseriesPanel(title, unit, description string, queries ...*prometheus.DataqueryBuilder) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(datasource()).
		Unit(unit).
		Min(0).
		Span(12).
		Height(8)
	for i, q := range queries {
		p.WithTarget(q.RefId(string(rune('A' + i))))
	}
	return p
}

func query(expr, legend string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().Expr(expr).LegendFormat(legend)
}
