package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	inboxmw "github.com/watermill-inbox/inbox/middleware"
)

// The order section: Kafka with orderPartitions partitions,
// -order-keys ordering keys with orderMessagesPerKey messages each,
// published in turn (the first message of every key, then the second of
// every one...) with the ordering key as the record key, each key on one
// partition; exactly failureRate of the messages fail their first attempt
// and every later attempt fails with that probability (the failures
// section's failures-10%). Three variants, one trial each per repetition:
//
//   - ordered: Config.OrderKey = inboxkafka.OrderByRecordKey and
//     Config.Redelivery = inboxkafka retry topics;
//   - unordered: the same without OrderKey;
//   - redelivery-unset: no Redelivery and no OrderKey: the consumer waits
//     the backoff out, blocking its partition, which keeps the order by
//     itself; at -order-unset-keys keys (its trials would take minutes at
//     the others' size).
//
// Every key's effects are checked against its publish order.
const (
	orderPartitions     = failuresKafkaPartitions
	orderMessagesPerKey = 10
	orderKeyPrefix      = "acct"
	orderBaseline       = "ordered"
	// orderUnsetKeysDefault is -order-unset-keys' default.
	orderUnsetKeysDefault = 200
)

// orderKeyName is the ordering key (and record key) of key i.
func orderKeyName(i int) string { return orderKeyPrefix + strconv.Itoa(i) }

func orderVariants() []failureVariant {
	return []failureVariant{
		{name: orderBaseline, rate: failureRate, order: true},
		{name: "unordered", rate: failureRate},
		{name: "redelivery-unset", rate: failureRate, inProcess: true},
	}
}

// orderStoreNames are the stores the section knows, as -order-stores names
// them, and as the tables name them.
var orderStoreNames = map[string]string{"redis": "Redis", "postgres": "PostgreSQL", "memory": "memory"}

type orderResults struct {
	stores          []string
	keys, unsetKeys int // ordering keys per trial: -order-keys, -order-unset-keys
	reps            int
	backoff         time.Duration
	retryPartitions int
	timeout         time.Duration // -order-timeout
	// trials[store][variant][rep]
	trials map[string]map[string][]failTrial
}

// group is the trial's shape of variant v on store.
func (r *orderResults) group(store string, v failureVariant) failGroup {
	keys := r.keys
	if v.inProcess {
		keys = r.unsetKeys
	}
	return failGroup{broker: "kafka", consumers: orderPartitions, n: keys * orderMessagesPerKey, orderKeys: keys, store: store, inProcess: v.inProcess, variants: []failureVariant{v}, cut: true}
}

// orderFirstFailures is firstFailures with a seed: the same messages of n
// fail their first attempt in every variant of repetition rep that has n
// messages.
func orderFirstFailures(n, rep int) []int {
	r := rand.New(rand.NewPCG(uint64(rep)+1, uint64(n)))
	return r.Perm(n)[:int(math.Round(failureRate*float64(n)))]
}

func runOrder(ctx context.Context, o options, logf func(string, ...any)) (*orderResults, error) {
	res := &orderResults{stores: o.orderStores, keys: o.orderKeys, unsetKeys: o.orderUnsetKeys, reps: o.orderReps,
		backoff: o.failuresBackoff, retryPartitions: o.failuresRetryPartitions, timeout: o.orderTimeout, trials: map[string]map[string][]failTrial{}}
	need := map[string]bool{}
	for _, s := range res.stores {
		need[s] = s != "memory"
		res.trials[s] = map[string][]failTrial{}
	}
	e, err := newEnv(ctx, o, need, 0)
	if err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.close(cctx); err != nil {
			logf("cleaning up: %v", err)
		}
	}()
	k, err := newKafka(o.kafkaBrokers, o.runID+"-o")
	if err != nil {
		return nil, err
	}
	defer func() { _ = k.close() }()
	k.retryPartitions = int32(o.failuresRetryPartitions)
	for rep := range res.reps {
		for si, store := range res.stores {
			for _, v := range rotate(orderVariants(), rep+si) {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				g := res.group(store, v)
				started := time.Now()
				t, err := runFailTrial(ctx, e, k, g, v, o.failuresBackoff, o.orderTimeout, orderFirstFailures(g.n, rep))
				if err != nil {
					return nil, fmt.Errorf("rep %d, %s: %w", rep+1, store, err)
				}
				res.trials[store][v.name] = append(res.trials[store][v.name], t)
				for _, why := range t.unfinishedWhy {
					logf("  unfinished: %s", why)
				}
				trips, _ := t.tripsPerKey90()
				all := t.tAll.Round(time.Millisecond).String()
				if t.cut > 0 {
					all = fmt.Sprintf("not within %s (%d unfinished)", t.cut, t.unfinished)
				}
				logf("rep %d/%d order %-8s %-16s %6d messages: 90%% in %s (%.0f msg/s), all in %s; %d failed attempts, %d hand-offs, %d Behind, %.2f round trips/msg; hand-offs behind: delay %s median, %s p90, %s max, at most %d of a message; 90%% floor %s; failed messages' next run after their backoff: %s median, %s p90; lag behind a failure %s median, %s p90; out of order: %d messages, %d keys; applied twice %d  trial %s",
					rep+1, res.reps, store, v.name, t.keys, t.t90.Round(time.Millisecond), t.rate90(), all,
					t.failed, t.calls[inboxmw.OpRedeliver], t.behind, trips,
					durMedian(t.behindDelays).Round(time.Millisecond), durQuantile(t.behindDelays, 0.9).Round(time.Millisecond), durQuantile(t.behindDelays, 1).Round(time.Millisecond), t.behindMost, t.floor90.Round(time.Millisecond),
					durMedian(t.slack).Round(time.Millisecond), durQuantile(t.slack, 0.9).Round(time.Millisecond),
					durMedian(t.lags).Round(time.Millisecond), durQuantile(t.lags, 0.9).Round(time.Millisecond),
					t.outOfOrder, t.keysOutOfOrder, t.doubled, time.Since(started).Round(10*time.Millisecond))
			}
		}
	}
	return res, nil
}

// ratios is, per repetition, f of the ordered trial over f of variant v's
// on store; none when either did not run.
func (r *orderResults) ratios(store, v string, f func(failTrial) float64) []float64 {
	if r == nil || r.trials[store] == nil {
		return nil
	}
	a, b := r.trials[store][orderBaseline], r.trials[store][v]
	var out []float64
	for i := range min(len(a), len(b)) {
		if y := f(b[i]); y > 0 {
			out = append(out, f(a[i])/y)
		}
	}
	return out
}

// counts is f of variant v's trials on store, one per repetition.
func (r *orderResults) counts(store, v string, f func(failTrial) int) []float64 {
	if r == nil || r.trials[store] == nil {
		return nil
	}
	var out []float64
	for _, t := range r.trials[store][v] {
		out = append(out, float64(f(t)))
	}
	return out
}

func (r *orderResults) col(store, v string, f func(failTrial) (float64, bool)) []float64 {
	var out []float64
	for _, t := range r.trials[store][v] {
		if x, ok := f(t); ok {
			out = append(out, x)
		}
	}
	return out
}

func (r *orderResults) markdown(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("## Order per key (issue 45)\n\n")
	p("Kafka with %d partitions; %d ordering keys with %d messages each, published in turn (the first message of every key, then the second...), the ordering key as the record key, each key on one partition; %s of messages fail their first attempt (the same messages in every variant of a repetition) and every later attempt fails with probability %.1f; the backoff %s. ",
		orderPartitions, r.keys, orderMessagesPerKey, strconv.FormatFloat(100*failureRate, 'f', 0, 64)+"%", failureRate, backoffName(r.backoff))
	p("Variants: `ordered`, `Config.OrderKey: inboxkafka.OrderByRecordKey` with `Redelivery` (the Kafka retry topics, %s); `unordered`, the same without `OrderKey`; `redelivery-unset`, neither: the consumer waits out each backoff, blocking its partition, which keeps the order by itself, at %d keys (%d messages) a trial: at the others' size a trial would take minutes. ",
		retryPartitionsName(r.retryPartitions), r.unsetKeys, r.unsetKeys*orderMessagesPerKey)
	p("%s, the variants in an order rotated from one to the next; ratios within a repetition.\n\n", strings.ToUpper(repetitions(r.reps)[:1])+repetitions(r.reps)[1:])
	p("**Throughput**: messages processed (effect applied) per second from the first delivery until 90%% of the trial's were; **ordered ÷** is the ordered variant's over this one's, within each repetition. **Behind**: the claims the store answered `inbox.Behind` (a message waiting behind an earlier one of its key: handed to the retry topics); **hand-offs behind**: the delays the middleware gave those hand-offs (before the retry topics' ladder rounds them up; at least a quarter of the time the message has waited behind), and the most hand-offs of one message that way. **90%% floor**: when the 90%% point would have come had each key's first failed message been applied when it was, every later one of the key as soon as that one was, the others at their first delivery: what waiting out the failed messages' own backoffs costs order, whatever is done with the messages behind them. **Lag**: for every message whose key had a failed attempt before it, the time from its predecessor's effect to its own. **All after**: until every message was applied; a trial past its 90%% point but unfinished %s after its consumers started is cut there (-order-timeout), its messages not applied by then counted. **Out of order**: messages applied after a later message of their key (must be 0 with `OrderKey`, and without `Redelivery`); a message not applied by the end of a trial not cut fails the run. Counts are totals over the repetitions, lags pooled, other figures medians.\n\n", r.timeout)
	for _, s := range r.stores {
		p("### %s\n\n", orderStoreNames[s])
		p("| variant | messages | msg/s until 90%% processed | ordered ÷ | 90%% after, s | 90%% floor, s | all after, s | failed attempts | hand-offs per message | Behind per message | store round trips per message until 90%% | hand-offs behind: delay median, ms | p90, ms | most of one message | lag: median, ms | p90, ms | out of order | keys out of order | applied twice |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, v := range orderVariants() {
			ts := r.trials[s][v.name]
			if len(ts) == 0 {
				continue
			}
			var lags, delays []time.Duration
			var out, keys, doubled, most int
			for _, t := range ts {
				lags, delays = append(lags, t.lags...), append(delays, t.behindDelays...)
				most = max(most, t.behindMost)
				out, keys, doubled = out+t.outOfOrder, keys+t.keysOutOfOrder, doubled+t.doubled
			}
			perMsg := func(f func(failTrial) float64) []float64 {
				return r.col(s, v.name, func(t failTrial) (float64, bool) { return f(t) / float64(t.keys), true })
			}
			rate := r.col(s, v.name, func(t failTrial) (float64, bool) { return t.rate90(), true })
			ratio := ""
			if v.name != orderBaseline {
				ratio = cell(r.ratios(s, v.name, rate90), "%.2f", true)
			}
			s90 := r.col(s, v.name, func(t failTrial) (float64, bool) { return t.t90.Seconds(), true })
			f90 := r.col(s, v.name, func(t failTrial) (float64, bool) { return t.floor90.Seconds(), t.floor90 > 0 })
			sAll := r.col(s, v.name, func(t failTrial) (float64, bool) { return t.tAll.Seconds(), t.cut == 0 })
			all := cell(sAll, "%.2f", false)
			if cuts := len(ts) - len(sAll); cuts > 0 {
				unfinished := 0
				for _, t := range ts {
					unfinished += t.unfinished
				}
				if all != "" {
					all += "; "
				}
				all += fmt.Sprintf("%d of %d not within %s (%d messages)", cuts, len(ts), r.timeout, unfinished)
			}
			failed := r.col(s, v.name, func(t failTrial) (float64, bool) { return float64(t.failed), true })
			ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d.Microseconds())/1e3, 'f', 0, 64) }
			lagMed, lagP90, delayMed, delayP90 := "", "", "", ""
			if len(lags) > 0 {
				lagMed, lagP90 = ms(durMedian(lags)), ms(durQuantile(lags, 0.9))
			}
			if len(delays) > 0 {
				delayMed, delayP90 = ms(durMedian(delays)), ms(durQuantile(delays, 0.9))
			}
			p("| %s | %d | %s | %s | %.2f | %s | %s | %.0f | %s | %s | %s | %s | %s | %d | %s | %s | %d | %d | %d |\n", v.name, ts[0].keys, cell(rate, "%.0f", true), ratio,
				median(s90), cell(f90, "%.2f", false), all, median(failed),
				cell(perMsg(func(t failTrial) float64 { return float64(t.calls[inboxmw.OpRedeliver]) }), "%.3f", false),
				cell(perMsg(func(t failTrial) float64 { return float64(t.behind) }), "%.3f", false),
				cell(r.col(s, v.name, failTrial.tripsPerKey90), "%.2f", false), delayMed, delayP90, most, lagMed, lagP90, out, keys, doubled)
		}
		p("\n")
	}
}

// orderTargets are the order section's rows, on Redis and PostgreSQL:
// the two target ratios of messages processed per second until 90% were,
// and the ordered variant's violations.
func (rep *report) orderTargets() []targetRow {
	r := rep.order
	unset := rep.opts.orderUnsetKeys
	if unset == 0 {
		unset = orderUnsetKeysDefault
	}
	if r != nil {
		unset = r.unsetKeys
	}
	var rows []targetRow
	for _, s := range []string{"redis", "postgres"} {
		at := where("kafka", orderPartitions, 0) + ", order per key (issue 45), " + orderStoreNames[s] + ": "
		rows = append(rows,
			targetRow{what: at + "messages processed per second until 90% were processed, ordered ÷ unordered (both with Redelivery)",
				values: r.ratios(s, "unordered", rate90), target: "≥ 0.5", ok: atLeast(0.5)},
			targetRow{what: at + fmt.Sprintf("the same, ordered ÷ redelivery-unset (no Redelivery, no OrderKey: the consumer waits out the backoff; %d keys × %d messages a trial)", unset, orderMessagesPerKey),
				values: r.ratios(s, "redelivery-unset", rate90), target: "≥ 20", ok: atLeast(20)},
			targetRow{what: at + "ordered: messages applied after a later message of their ordering key (violations)",
				values: r.counts(s, orderBaseline, func(t failTrial) int { return t.outOfOrder }), target: "= 0", ok: func(m float64) bool { return m == 0 }, total: true},
		)
	}
	return rows
}

// pickOrderStores checks -order-stores.
func pickOrderStores(names []string) error {
	if len(names) == 0 {
		return fmt.Errorf("%w: -order-stores names none", errNoStore)
	}
	for _, n := range names {
		if _, ok := orderStoreNames[n]; !ok {
			return fmt.Errorf("%w: -order-stores: %q (known: redis, postgres, memory)", errNoStore, n)
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(names)))) != len(names) {
		return fmt.Errorf("%w: -order-stores names a store twice: %v", errNoStore, names)
	}
	return nil
}
