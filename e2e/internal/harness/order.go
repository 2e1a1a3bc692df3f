package harness

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
)

// The order scenario's workload and faults.
const (
	orderAccounts   = 30
	orderEvents     = 8
	orderPartitions = 4
	// orderFailOneIn: the first attempt of about one event in six fails.
	orderFailOneIn = 6
	orderBackoff   = 300 * time.Millisecond
	orderWork      = 20 * time.Millisecond
	// OrderFreeze is how long the order scenario freezes the store's link.
	OrderFreeze = 3 * time.Second
)

// orderAccount is the order key of account a (RabbitMQ: the metadata
// field "account"; Kafka: the record key).
func orderAccount(a int) string { return fmt.Sprintf("a%02d", a) }

// orderID is the id (payload and IdempotencyKey) of event ev of account a.
func orderID(a, ev int) string { return fmt.Sprintf("o-%s-e%d", orderAccount(a), ev) }

// Order is scenario (k), order per key: 30 accounts with 8 events each,
// published in order per account (event 0 of every account, then event
// 1, ...; on Kafka with the account as the record key, its partition the
// account's), the first attempt of about one event in six failing
// (before the effect) and handed to the broker's redelivery (Kafka retry
// topics, RabbitMQ delay queues), with Config.OrderKey set when withKey
// (Kafka: inboxkafka.OrderByRecordKey; RabbitMQ: the metadata field
// "account", on a single active consumer queue). Two consumer processes
// share the work (a Kafka group of two; on RabbitMQ one active consumer
// and one standing by); the store's link freezes for OrderFreeze (the
// fault proxy stalls connections) once a quarter of the events are
// applied, and once half of them are, the consumer that applied the last
// one is killed with SIGKILL and a replacement started.
//
// Every application is a ledger line with the applying process's id. Per
// account the first applications must be events 0 to 7 in order (no order
// violation, none lost); an event may be applied twice only in the crash
// window (its first application by the killed process, which had not
// marked it processed when it died, the second right after it, before any
// later event of its account). withKey false is the check that the
// scenario can fail: without an order key it finds violations.
func Order(withKey bool) func(t *testing.T, bk BrokerKind, sk StoreKind) {
	return func(t *testing.T, bk BrokerKind, sk StoreKind) {
		if sk.NoCrossProcess != "" {
			skip(t, sk.Name, "order", sk.NoCrossProcess)
		}
		if sk.NoOutage != "" {
			skip(t, sk.Name, "order", sk.NoOutage)
		}
		start := time.Now()
		e := newEnv(t, bk, sk, true, orderPartitions, func(b *BrokerSpec) { b.SingleActive = true })
		led, ok := e.ledger.(*FileLedger)
		if !ok {
			t.Fatalf("the order scenario needs a file ledger, not %T", e.ledger)
		}
		spec := e.spec
		spec.Redeliver, spec.Backoff = true, orderBackoff
		spec.FailFirstOneIn, spec.LedgerPID, spec.Work = orderFailOneIn, true, orderWork
		spec.Lease, spec.StoreTimeout = 2*time.Second, time.Second
		if withKey {
			spec.OrderKey = "account"
			if e.b.Kind == Kafka {
				spec.OrderKey = OrderByRecordKey
			}
		}
		e.cleanupRedelivery(t, spec.Dest, spec.Group)

		var ids []string
		var msgs []*message.Message
		for ev := range orderEvents {
			for a := range orderAccounts {
				id := orderID(a, ev)
				m := NewMessage(id, a%orderPartitions)
				m.Metadata.Set("account", orderAccount(a))
				m.Metadata.Set(recordKey, orderAccount(a))
				ids, msgs = append(ids, id), append(msgs, m)
			}
		}
		failing := 0
		for _, id := range ids {
			if spec.failsFirst(id) {
				failing++
			}
		}

		// Two consumers; on RabbitMQ the first is the active one.
		children := []*Child{StartChild(t, spec)}
		if e.b.Kind == Rabbit {
			e.b.WaitConsumers(t, spec.Dest, spec.Group, 1)
		}
		children = append(children, StartChild(t, spec))
		e.b.WaitConsumers(t, spec.Dest, spec.Group, 2)
		e.publish(t, msgs...)

		n := len(ids)
		applied := func() int { return len(led.Lines(t)) }
		missing := func() []string { return orderMissing(led.Lines(t), ids) }
		progress := func() string {
			m := missing()
			return fmt.Sprintf("%d of %d events applied (missing %v), %d lines", n-len(m), n, m[:min(10, len(m))], applied())
		}
		waitFor(t, 60*time.Second, "a quarter of the events applied", func() bool { return applied() >= n/4 }, progress)
		e.store.Proxy.Stall()
		frozeAt, stalled := applied(), 0
		for until := time.Now().Add(OrderFreeze); time.Now().Before(until); time.Sleep(20 * time.Millisecond) {
			stalled = max(stalled, e.store.Proxy.Stalled())
		}
		thawedAt := applied()
		e.store.Proxy.Restore()
		if stalled == 0 {
			t.Errorf("no connection to the store stalled in the %s freeze: the consumers did not meet it", OrderFreeze)
		}

		waitFor(t, 60*time.Second, "half of the events applied", func() bool { return applied() >= n/2 }, progress)
		lines := led.Lines(t)
		killedAt := len(lines)
		_, lastPID, _ := strings.Cut(lines[len(lines)-1], " ")
		var victim *Child
		for _, c := range children {
			if strconv.Itoa(c.Pid()) == lastPID {
				victim = c
			}
		}
		if victim == nil {
			t.Fatalf("the last ledger line %q names none of the consumers", lines[len(lines)-1])
		}
		victim.Kill(t)
		killed := map[string]bool{lastPID: true}
		// The crash window: the events the killed consumer applied and had
		// not marked processed when it died (read after its death; a mark
		// it sent just before may still land, which only shrinks it). All
		// its lines: it may have applied more between killedAt and the
		// kill.
		window := map[string]bool{}
		for _, l := range led.Lines(t) {
			if id, pid, _ := strings.Cut(l, " "); pid == lastPID && !window[id] && e.record(t, id).State != inbox.StateProcessed {
				window[id] = true
			}
		}
		survivors := []*Child{StartChild(t, spec)}
		for _, c := range children {
			if c != victim {
				survivors = append(survivors, c)
			}
		}

		if !waitUntil(60*time.Second, func() bool { return len(missing()) == 0 }) {
			t.Errorf("not every event applied within 60 s: %s", progress())
		} else if marked := slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return window[id] }); withKey &&
			!waitUntil(30*time.Second, func() bool { return e.processed(t, marked) }) {
			// The killed consumer's unmarked events may stay unmarked (it
			// may have acked them: the crash window); the others must not.
			// Without an order key a mark pending when the freeze began
			// is given up at the lease's end, as documented.
			t.Errorf("not every event marked processed within 30 s: %s", e.unprocessed(t, marked))
		}
		for _, c := range survivors {
			c.CheckRunning(t)
		}

		rep, err := checkOrder(led.Lines(t), killed)
		if err != nil {
			t.Fatal(err)
		}
		summary := fmt.Sprintf("%d events (%d failing their first attempt), %d applications; freeze at %d applied, %d applied during it, %d connections stalled; killed at %d applied, %d of them not marked processed; %d doubles %v; %.1f s",
			n, failing, rep.lines, frozeAt, thawedAt-frozeAt, stalled, killedAt, len(window), len(rep.doubles), rep.doubles, time.Since(start).Seconds())
		if !withKey {
			// The check that the scenario can fail.
			if len(rep.violations) == 0 {
				t.Errorf("without an order key, no order violation found: the scenario checks nothing; %s", summary)
			}
			t.Logf("without an order key: %d order violations, e.g. %v; %s", len(rep.violations), rep.violations[:min(3, len(rep.violations))], summary)
			return
		}
		for _, v := range rep.violations {
			t.Errorf("order violation: %s", v)
		}
		for _, id := range rep.lost {
			t.Errorf("lost: %s never applied", id)
		}
		for _, d := range rep.outside {
			t.Errorf("applied twice outside the crash window: %s", d)
		}
		for _, id := range rep.doubles {
			if !window[id] {
				t.Errorf("%s applied twice, first by the killed consumer, which had marked it processed", id)
			}
		}
		// The failed first attempts went through the store and the broker:
		// their keys were claimed at least twice.
		for _, id := range ids {
			if spec.failsFirst(id) {
				if rec := e.record(t, id); rec.Attempts < 2 {
					t.Errorf("%s, whose first attempt fails, has %d attempts (%v), want at least 2", id, rec.Attempts, rec.State)
				}
			}
		}
		if t.Failed() {
			t.Logf("the accounts in question, in the order applied (event/pid, killed pid %s):\n%s", lastPID, rep.sequences)
			e.describeAccounts(t, rep.lost)
		}
		t.Logf("%s", summary)
	}
}

// waitUntil polls cond every 20 ms until it holds (true) or timeout passed
// (false).
func waitUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// describeAccounts logs, for the accounts of the events ids, the store's
// gate of the account's order key and the records of its events.
func (e *env) describeAccounts(t *testing.T, ids []string) {
	oa, ok := e.store.Inspect.(inbox.OrderAdmin)
	done := map[string]bool{}
	for _, id := range ids {
		var a, ev int
		if _, err := fmt.Sscanf(id, "o-a%d-e%d", &a, &ev); err != nil || done[orderAccount(a)] {
			continue
		}
		done[orderAccount(a)] = true
		var b strings.Builder
		if ok {
			key := e.spec.Key(orderID(a, 0))
			g, err := oa.Order(t.Context(), key[:strings.LastIndexByte(key, ':')+1]+orderAccount(a))
			fmt.Fprintf(&b, "gate %+v (%v);", g, err)
		}
		for ev := range orderEvents {
			rec := e.record(t, orderID(a, ev))
			fmt.Fprintf(&b, " e%d: %v, %d attempts, last seen %s, lease until %s;", ev, rec.State, rec.Attempts,
				rec.LastSeen.Format("15:04:05.000"), rec.LeaseUntil.Format("15:04:05.000"))
		}
		t.Logf("account %s: %s", orderAccount(a), b.String())
	}
}

// orderMissing returns the ids no line of the order ledger applied.
func orderMissing(lines, ids []string) []string {
	seen := make(map[string]bool, len(lines))
	for _, l := range lines {
		id, _, _ := strings.Cut(l, " ")
		seen[id] = true
	}
	return slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return seen[id] })
}

// unprocessed describes the records of the ids not marked processed (at
// most ten).
func (e *env) unprocessed(t *testing.T, ids []string) string {
	var out []string
	for _, id := range ids {
		if rec := e.record(t, id); rec.State != inbox.StateProcessed {
			out = append(out, fmt.Sprintf("%s: %v, %d attempts, lease until %s", id, rec.State, rec.Attempts, rec.LeaseUntil.Format(time.TimeOnly)))
		}
	}
	if len(out) > 10 {
		out = append(out[:10], fmt.Sprintf("and %d more", len(out)-10))
	}
	return strings.Join(out, "; ")
}

// orderReport is what checkOrder finds in the order scenario's ledger.
type orderReport struct {
	lines int
	// violations: an event first applied after a later event of its
	// account, or applied again after a later one.
	violations []string
	// lost: events never applied.
	lost []string
	// doubles: events applied a second time right after their first
	// application, which a killed process made (the crash window).
	doubles []string
	// outside: other second (or third) applications.
	outside []string
	// sequences lists the accounts with a finding, each with its
	// applications in order (event/pid).
	sequences string
}

// checkOrder reads the order scenario's ledger (lines "<id> <pid>", in the
// order applied): per account, the first applications must be its events
// in order, all of them; a second application is in the crash window when
// it follows the first at once (no other event of the account between)
// and the first was made by a process of killed.
func checkOrder(lines []string, killed map[string]bool) (orderReport, error) {
	type app struct {
		ev  int
		pid string
	}
	rep := orderReport{lines: len(lines)}
	byAccount := make([][]app, orderAccounts)
	for i, l := range lines {
		var a, ev int
		var pid string
		if _, err := fmt.Sscanf(l, "o-a%d-e%d %s", &a, &ev, &pid); err != nil || a < 0 || a >= orderAccounts || ev < 0 || ev >= orderEvents || l != orderID(a, ev)+" "+pid {
			return rep, fmt.Errorf("ledger line %d %q is not an event of the order scenario and a process id", i+1, l)
		}
		byAccount[a] = append(byAccount[a], app{ev, pid})
	}
	var seqs strings.Builder
	for a, apps := range byAccount {
		found := len(rep.violations) + len(rep.lost) + len(rep.outside) + len(rep.doubles)
		count := make([]int, orderEvents)
		highest := -1
		for i, x := range apps {
			id := orderID(a, x.ev)
			count[x.ev]++
			switch {
			case count[x.ev] == 1 && x.ev < highest:
				rep.violations = append(rep.violations, fmt.Sprintf("%s first applied after %s", id, orderID(a, highest)))
			case count[x.ev] == 1:
			case apps[i-1].ev != x.ev:
				rep.violations = append(rep.violations, fmt.Sprintf("%s applied again (%d times) after %s", id, count[x.ev], orderID(a, apps[i-1].ev)))
			case count[x.ev] == 2 && killed[apps[i-1].pid]:
				rep.doubles = append(rep.doubles, id)
			default:
				rep.outside = append(rep.outside, fmt.Sprintf("%s applied %d times, the one before by process %s, which was not killed", id, count[x.ev], apps[i-1].pid))
			}
			highest = max(highest, x.ev)
		}
		for ev, c := range count {
			if c == 0 {
				rep.lost = append(rep.lost, orderID(a, ev))
			}
		}
		if len(rep.violations)+len(rep.lost)+len(rep.outside)+len(rep.doubles) > found {
			parts := make([]string, len(apps))
			for i, x := range apps {
				parts[i] = strconv.Itoa(x.ev) + "/" + x.pid
			}
			fmt.Fprintf(&seqs, "  %s: %s\n", orderAccount(a), strings.Join(parts, " "))
		}
	}
	slices.Sort(rep.doubles)
	rep.sequences = seqs.String()
	return rep, nil
}
