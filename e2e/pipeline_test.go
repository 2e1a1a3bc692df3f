package e2e_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	inboxamqp "github.com/watermill-inbox/inbox/amqp"
	"github.com/watermill-inbox/inbox/e2e/internal/harness"
	"github.com/watermill-inbox/inbox/internal/faultproxy"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/keying"
	inboxmw "github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	"github.com/watermill-inbox/inbox/stores/sql/txinbox"
)

// The pipeline: three stages and a forwarder, each in a child process.
//
//	RabbitMQ q1 -> stage 1 (Redis store, leased; effect: a line in a file)
//	  -> Kafka t2 -> stage 2 (PostgreSQL, txinbox; effect: a row, and its
//	     output through Watermill's SQL publisher, in one transaction)
//	  -> SQL outbox -> forwarder (components/forwarder) -> RabbitMQ q3
//	  -> stage 3 (PostgreSQL, txinbox; the final effect: a row)
//
// Each stage handles a message's id (its JSON payload) and passes it on in a
// new message it returns, without an IdempotencyKey: the middleware gives
// it the derived one, unless the test turns that off.

const rolePipeline = "pipeline-stage"

func init() { harness.RegisterChild(rolePipeline, runPipelineStage) }

// Stages of the pipeline, as child processes run them.
const (
	stage1    = "stage1"
	stage2    = "stage2"
	fwdStage  = "forwarder"
	stage3    = "stage3"
	endInput  = "p-end" // the last input: when it is applied at stage 3, everything before it was handled everywhere
	plLease   = 5 * time.Second
	plOutage  = 1500 * time.Millisecond
	plTimeout = 90 * time.Second
)

// pipelineSpec is what a stage's process needs; it travels as JSON.
type pipelineSpec struct {
	Stage   string             `json:"stage"`
	Rabbit  harness.BrokerSpec `json:"rabbit"`
	Kafka   harness.BrokerSpec `json:"kafka"`
	Q1      string             `json:"q1"`
	T2      string             `json:"t2"`
	Q3      string             `json:"q3"`
	Group2  string             `json:"group2"` // stage 2's Kafka consumer group
	Outbox  string             `json:"outbox"` // the SQL topic of the forwarder
	Redis   string             `json:"redis"`  // stage 1's store URL (through the fault proxy)
	PG      string             `json:"pg"`     // PostgreSQL URL, without store parameters
	S2Table string             `json:"s2_table"`
	S3Table string             `json:"s3_table"`
	// Ledger is stage 1's effect (a file); stages 2 and 3 write theirs in
	// the tables S2Table+"_effects" and S3Table+"_effects".
	Ledger string `json:"ledger"`
	// Arrivals records every delivery a stage's router gets (a file): the
	// duplicates the faults make, which the inboxes must drop.
	Arrivals string `json:"arrivals"`
	// KeepOutputIDs turns the derived ids off, in stages 1 and 2.
	KeepOutputIDs bool `json:"keep_output_ids,omitempty"`
	// CrashID is the input at which the process kills itself.
	CrashID string `json:"crash_id,omitempty"`
}

func (s pipelineSpec) with(stage, crashID string) pipelineSpec {
	s.Stage, s.CrashID = stage, crashID
	return s
}

type idPayload struct {
	ID string `json:"id"`
}

func payloadOf(id string) []byte {
	b, _ := json.Marshal(idPayload{ID: id})
	return b
}

func idOf(msg *message.Message) (string, error) {
	var p idPayload
	if err := json.Unmarshal(msg.Payload, &p); err != nil || p.ID == "" {
		return "", fmt.Errorf("payload %q is not {\"id\": ...}: %v", msg.Payload, err)
	}
	return p.ID, nil
}

// die kills the process at its crash point.
func die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// arrivals is an outer middleware that records each delivery's id as
// "stage:id" before anything else sees it.
func arrivals(stage string, l *harness.FileLedger) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if id, err := idOf(msg); err == nil {
				if err := l.Apply(stage + ":" + id); err != nil {
					return nil, err
				}
			}
			return h(msg)
		}
	}
}

// crashPublisher kills the process once it has published the message of
// crashID (after the broker took it, before the router's ack), first
// calling before.
type crashPublisher struct {
	message.Publisher
	crashID string
	before  func()
}

func (p crashPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	for _, m := range msgs {
		if id, _ := idOf(m); id == p.crashID && p.crashID != "" {
			if p.before != nil {
				p.before()
			}
			die()
		}
	}
	return nil
}

func runPipelineStage(raw []byte) error {
	var spec pipelineSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return err
	}
	arr := &harness.FileLedger{Path: spec.Arrivals}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	switch spec.Stage {
	case stage1:
		err = setupStage1(router, spec, arr, logger)
	case stage2:
		err = setupStage2(router, spec, arr, logger)
	case fwdStage:
		return runForwarder(spec, logger)
	case stage3:
		err = setupStage3(router, spec, arr, logger)
	default:
		err = fmt.Errorf("unknown stage %q", spec.Stage)
	}
	if err != nil {
		return err
	}
	return router.Run(context.Background())
}

// setupStage1: RabbitMQ q1 -> Redis store -> Kafka t2. The effect is a
// line in a file, outside any transaction: a crash after it and before the
// mark applies it again (the documented window). Its crash point is after
// the router published the output and before the ack.
func setupStage1(router *message.Router, spec pipelineSpec, arr *harness.FileLedger, logger watermill.LoggerAdapter) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := stores.Open(ctx, spec.Redis)
	if err != nil {
		return err
	}
	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "rabbit", Group: spec.Q1, Lease: plLease,
		KeepOutputIDs: spec.KeepOutputIDs, Logger: logger})
	if err != nil {
		return err
	}
	sub, err := spec.Rabbit.Subscriber(spec.Q1)
	if err != nil {
		return err
	}
	kpub, err := spec.Kafka.Publisher()
	if err != nil {
		return err
	}
	led := &harness.FileLedger{Path: spec.Ledger}
	var mu sync.Mutex
	applied := map[string]string{} // id -> inbox key, of the effects this process applied
	pub := crashPublisher{Publisher: kpub, crashID: spec.CrashID, before: func() {
		// The marks of the messages handled before follow their acks
		// asynchronously: let them land, so the crash hits this message only.
		mu.Lock()
		defer mu.Unlock()
		deadline := time.Now().Add(20 * time.Second)
		for id, key := range applied {
			for id != spec.CrashID {
				rec, err := store.Get(context.Background(), key)
				if err == nil && rec.State == inbox.StateProcessed {
					break
				}
				if time.Now().After(deadline) {
					fmt.Fprintf(os.Stderr, "stage 1: key %s still not processed before the crash: %v %v\n", key, rec.State, err)
					os.Exit(4)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}}
	router.AddMiddleware(arrivals(stage1, arr), ib.Middleware)
	router.AddHandler(stage1, spec.Q1, sub, spec.T2, pub, func(msg *message.Message) ([]*message.Message, error) {
		id, err := idOf(msg)
		if err != nil {
			return nil, err
		}
		if err := led.Apply(id); err != nil { // the effect
			return nil, err
		}
		mu.Lock()
		applied[id] = inboxmw.KeyFromCtx(msg.Context())
		mu.Unlock()
		return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
	})
	return nil
}

// openPG opens the pipeline's PostgreSQL database.
func openPG(raw string) (*sql.DB, error) { return sql.Open("pgx", raw) }

// outboxPublisher is stage 2's txinbox.Config.Outbox: Watermill's SQL
// publisher on the handler's transaction, wrapped by the forwarder's
// envelope for q3.
func outboxPublisher(spec pipelineSpec) txinbox.OutboxFunc {
	return func(_ context.Context, tx *sql.Tx, msgs []*message.Message) error {
		pub, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: spec.Outbox}).Publish(spec.Q3, msgs...)
	}
}

// noPublisher is the router publisher of stage 2, which never publishes:
// txinbox hands the returned messages to the outbox.
type noPublisher struct{}

func (noPublisher) Publish(topic string, msgs ...*message.Message) error {
	return fmt.Errorf("stage 2 published %d message(s) to %s through the router, not the outbox", len(msgs), topic)
}
func (noPublisher) Close() error { return nil }

// setupStage2: Kafka t2 -> txinbox on PostgreSQL: the effect (a row), the
// output (the SQL outbox) and the mark commit together. Its crash point is
// after the commit and before the router's ack.
func setupStage2(router *message.Router, spec pipelineSpec, arr *harness.FileLedger, logger watermill.LoggerAdapter) error {
	db, err := openPG(spec.PG)
	if err != nil {
		return err
	}
	txs, err := txinbox.New(txinbox.Config{DB: db, Dialect: sqlstore.Postgres, Table: spec.S2Table, LockTimeout: 5 * time.Second,
		Outbox: outboxPublisher(spec)})
	if err != nil {
		return err
	}
	ib, err := inboxmw.New(inboxmw.Config{Store: txs, Bus: "kafka", Group: spec.Group2, KeepOutputIDs: spec.KeepOutputIDs, Logger: logger})
	if err != nil {
		return err
	}
	sub, err := spec.Kafka.Subscriber(spec.Group2)
	if err != nil {
		return err
	}
	crashAfterCommit := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if id, _ := idOf(msg); err == nil && id == spec.CrashID {
				die()
			}
			return out, err
		}
	}
	insert := "INSERT INTO " + spec.S2Table + "_effects (id) VALUES ($1)"
	router.AddMiddleware(arrivals(stage2, arr), crashAfterCommit, ib.Middleware)
	router.AddHandler(stage2, spec.T2, sub, "unused", noPublisher{}, func(msg *message.Message) ([]*message.Message, error) {
		id, err := idOf(msg)
		if err != nil {
			return nil, err
		}
		tx, ok := txinbox.TxFromContext(msg.Context())
		if !ok {
			return nil, errors.New("stage 2: no transaction in the message context")
		}
		if _, err := tx.ExecContext(msg.Context(), insert, id); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
	})
	return nil
}

// runForwarder relays the SQL outbox to RabbitMQ q3 (Watermill's
// forwarder), with publisher confirms. Its crash point is after the publish
// to q3 and before the ack of the outbox row.
func runForwarder(spec pipelineSpec, logger watermill.LoggerAdapter) error {
	db, err := openPG(spec.PG)
	if err != nil {
		return err
	}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		ConsumerGroup:  "forwarder",
		SchemaAdapter:  wsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
		PollInterval:   50 * time.Millisecond,
		ResendInterval: 50 * time.Millisecond,
		RetryInterval:  100 * time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	cfg := wamqp.NewDurableQueueConfig(spec.Rabbit.AMQPURL)
	cfg.Marshaler = inboxamqp.Marshaler{}
	cfg.Publish.ConfirmDelivery = true
	pub, err := wamqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		return err
	}
	fwd, err := forwarder.NewForwarder(sub, crashPublisher{Publisher: pub, crashID: spec.CrashID}, logger,
		forwarder.Config{ForwarderTopic: spec.Outbox})
	if err != nil {
		return err
	}
	return fwd.Run(context.Background())
}

// setupStage3: RabbitMQ q3 -> txinbox on PostgreSQL; the final effect is a
// row. Its crash point is after the effect and before the commit (the
// mark).
func setupStage3(router *message.Router, spec pipelineSpec, arr *harness.FileLedger, logger watermill.LoggerAdapter) error {
	db, err := openPG(spec.PG)
	if err != nil {
		return err
	}
	txs, err := txinbox.New(txinbox.Config{DB: db, Dialect: sqlstore.Postgres, Table: spec.S3Table, LockTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	ib, err := inboxmw.New(inboxmw.Config{Store: txs, Bus: "rabbit", Group: spec.Q3, Logger: logger})
	if err != nil {
		return err
	}
	sub, err := spec.Rabbit.Subscriber(spec.Q3)
	if err != nil {
		return err
	}
	insert := "INSERT INTO " + spec.S3Table + "_effects (id) VALUES ($1)"
	router.AddMiddleware(arrivals(stage3, arr), ib.Middleware)
	router.AddConsumerHandler(stage3, spec.Q3, sub, func(msg *message.Message) error {
		id, err := idOf(msg)
		if err != nil {
			return err
		}
		tx, ok := txinbox.TxFromContext(msg.Context())
		if !ok {
			return errors.New("stage 3: no transaction in the message context")
		}
		if _, err := tx.ExecContext(msg.Context(), insert, id); err != nil {
			return err
		}
		if id == spec.CrashID {
			die() // the effect is written, the transaction (and the mark) not committed
		}
		return nil
	})
	return nil
}

// ---- The test ----------------------------------------------------------

// TestPipeline_effectively_once_across_stages runs 31 inputs, each
// published twice, through the pipeline while each stage and the forwarder
// is killed with SIGKILL at its crash point once, and stage 1's store is
// cut. Nothing is lost; stages 2 and 3 apply each input exactly once;
// stage 1 applies the input it crashed on twice (its documented window)
// and every other once, and its second output is dropped by stage 2.
func TestPipeline_effectively_once_across_stages(t *testing.T) {
	runPipeline(t, false)
}

// TestPipeline_without_derived_ids_doubles_at_stage_3 is the same run with
// the derived ids turned off (Config.KeepOutputIDs): stage 1's second run
// returns an output with a new id, which stages 2 and 3 take for new work.
// It asserts the doubling: the derived ids are what closes the gap.
func TestPipeline_without_derived_ids_doubles_at_stage_3(t *testing.T) {
	runPipeline(t, true)
}

func runPipeline(t *testing.T, keepIDs bool) {
	t.Parallel()
	for _, b := range harness.Brokers() {
		if b.Name == harness.Rabbit {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			pipelineCase(t, b, keepIDs)
		})
	}
}

func pipelineCase(t *testing.T, kafkaKind harness.BrokerKind, keepIDs bool) {
	start := time.Now()
	rabbit := harness.BrokerSpec{Kind: harness.Rabbit, AMQPURL: testenv.RabbitMQ.URL(t)}
	kafka := kafkaKind.Start(t)
	pgURL := testenv.Postgres.URL(t)
	redisURL := testenv.Redis.URL(t)
	u := unique()
	spec := pipelineSpec{
		Rabbit: rabbit, Kafka: kafka,
		Q1: rabbit.CreateDest(t, 1), T2: kafka.CreateDest(t, 1), Q3: rabbit.CreateDest(t, 1),
		Group2:  "stage2-" + u,
		Outbox:  "pl_" + u + "_outbox",
		PG:      pgURL,
		S2Table: "pl_" + u + "_s2", S3Table: "pl_" + u + "_s3",
		Ledger: harness.NewFileLedger(t).Path, Arrivals: harness.NewFileLedger(t).Path,
		KeepOutputIDs: keepIDs,
	}
	effects2, effects3 := preparePG(t, spec)
	proxy := prepareRedis(t, &spec, redisURL, u)

	// Inputs: 20, then 10 during the store cut, then the last; each
	// published twice (a producer retry: same IdempotencyKey, new UUID).
	batch1, batch2 := harness.IDs("p", 20), harness.IDs("p", 30)[20:]
	crash := map[string]string{stage1: "p-003", stage2: "p-008", fwdStage: "p-013", stage3: "p-017"}
	order := []string{stage1, stage2, fwdStage, stage3}
	children := map[string]*harness.Child{}
	for _, st := range order {
		children[st] = harness.StartChildRole(t, rolePipeline, spec.with(st, crash[st]))
	}
	var survivors []*harness.Child
	t.Cleanup(func() {
		if t.Failed() {
			for _, st := range order {
				t.Logf("%s (crashed) output:\n%s", st, tail(children[st].Output()))
			}
			for i, c := range survivors {
				t.Logf("%s (survivor) output:\n%s", order[i], tail(c.Output()))
			}
		}
	})
	pub, err := rabbit.Publisher()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	publishInputs(t, pub, spec.Q1, batch1...)

	// Each process dies at its crash point, in pipeline order; a survivor
	// takes over its queue, group or outbox.
	for _, st := range order {
		children[st].WaitKilled(t, plTimeout)
		survivors = append(survivors, harness.StartChildRole(t, rolePipeline, spec.with(st, "")))
	}
	ledger1 := &harness.FileLedger{Path: spec.Ledger}
	waitForIDs(t, "batch 1 applied at stage 3", effects3, batch1)

	// The store cut: stage 1's claims fail (in-process retries, then nacks),
	// nothing is applied, and everything is applied once it is restored.
	proxy.Cut()
	publishInputs(t, pub, spec.Q1, batch2...)
	time.Sleep(plOutage) // the length of the outage, not a synchronisation
	applied := ledger1.Counts(t)
	proxy.Restore()
	for _, id := range batch2 {
		if applied[id] > 0 {
			t.Errorf("stage 1 applied %s while its store was cut", id)
		}
	}
	waitForIDs(t, "batch 2 applied at stage 3", effects3, batch2)
	publishInputs(t, pub, spec.Q1, endInput)
	waitForIDs(t, "the last input applied at stage 3", effects3, []string{endInput})

	inputs := append(append(slices.Clone(batch1), batch2...), endInput)
	c1, c2, c3 := ledger1.Counts(t), effects2.Counts(t), effects3.Counts(t)
	arr := (&harness.FileLedger{Path: spec.Arrivals}).Counts(t)
	lost, doubled := map[string][]string{}, map[string][]string{}
	for _, id := range inputs {
		for st, c := range map[string]map[string]int{stage1: c1, stage2: c2, stage3: c3} {
			switch {
			case c[id] == 0:
				lost[st] = append(lost[st], id)
			case c[id] > 1:
				doubled[st] = append(doubled[st], id)
			}
		}
	}
	for _, m := range []map[string][]string{lost, doubled} {
		for _, ids := range m {
			slices.Sort(ids)
		}
	}
	final := 0
	for _, n := range c3 {
		final += n
	}
	testenv.Report(t, "pipeline (%s, derived ids %v): inputs %d (each published twice); final effects %d; lost: stage 1 %d, stage 2 %d, stage 3 %d; "+
		"doubled: stage 1 %d %v, stage 2 %d %v, stage 3 %d %v; deliveries: stage 2 got %s %d times, %s %d times; stage 3 got %s %d times, %s %d times; %s",
		kafkaKind.Name, !keepIDs, len(inputs), final, len(lost[stage1]), len(lost[stage2]), len(lost[stage3]),
		len(doubled[stage1]), doubled[stage1], len(doubled[stage2]), doubled[stage2], len(doubled[stage3]), doubled[stage3],
		crash[stage1], arr[stage2+":"+crash[stage1]], crash[stage2], arr[stage2+":"+crash[stage2]],
		crash[fwdStage], arr[stage3+":"+crash[fwdStage]], crash[stage3], arr[stage3+":"+crash[stage3]], time.Since(start).Round(time.Millisecond))

	for st, ids := range lost {
		t.Errorf("lost at %s: %v", st, ids)
	}
	if got := c1[crash[stage1]]; got != 2 {
		t.Errorf("stage 1 applied %s %d times, want 2: it crashed after the effect and the publish, before the mark", crash[stage1], got)
	}
	if got := doubled[stage1]; !slices.Equal(got, []string{crash[stage1]}) {
		t.Errorf("stage 1 doubled %v, want only %s (the crash window)", got, crash[stage1])
	}
	// The faults made duplicates downstream, which the inboxes met.
	for _, d := range []struct{ stage, id, why string }{
		{stage2, crash[stage1], "stage 1's second run published its output again"},
		{stage2, crash[stage2], "stage 2 crashed before its ack"},
		{stage3, crash[fwdStage], "the forwarder crashed between its publish and its ack"},
		{stage3, crash[stage3], "stage 3 crashed before its commit"},
	} {
		if n := arr[d.stage+":"+d.id]; n < 2 {
			t.Errorf("%s got %s %d times, want at least 2: %s", d.stage, d.id, n, d.why)
		}
	}
	if keepIDs {
		// Without derived ids stage 1's second output is new work downstream.
		for st, c := range map[string]map[string]int{stage2: c2, stage3: c3} {
			if !slices.Equal(doubled[st], []string{crash[stage1]}) || c[crash[stage1]] != 2 {
				t.Errorf("without derived ids %s doubled %v (%s applied %d times); want %s doubled, and nothing else", st, doubled[st], crash[stage1], c[crash[stage1]], crash[stage1])
			}
		}
		return
	}
	for _, st := range []string{stage2, stage3} {
		if len(doubled[st]) > 0 {
			t.Errorf("%s doubled %v, want every input applied exactly once", st, doubled[st])
		}
	}
}

func tail(s string) string {
	if len(s) > 4000 {
		return "..." + s[len(s)-4000:]
	}
	return s
}

func publishInputs(t *testing.T, pub message.Publisher, queue string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		for range 2 {
			msg := message.NewMessage(watermill.NewUUID(), payloadOf(id))
			msg.Metadata.Set(keying.DefaultIDMetadataKey, id)
			if err := pub.Publish(queue, msg); err != nil {
				t.Fatalf("publishing %s: %v", id, err)
			}
		}
	}
}

// waitForIDs polls the ledger until every id is in it.
func waitForIDs(t *testing.T, what string, l harness.Ledger, ids []string) {
	t.Helper()
	deadline := time.Now().Add(plTimeout)
	for {
		c := l.Counts(t)
		var missing []string
		for _, id := range ids {
			if c[id] == 0 {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not done within %s: %s; missing %v", plTimeout, what, missing)
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
}

// preparePG creates the inbox tables of stages 2 and 3, their effect tables
// and the SQL outbox, and drops them all when the test ends.
func preparePG(t *testing.T, spec pipelineSpec) (effects2, effects3 *tableLedger) {
	t.Helper()
	db := openDB(t, spec.PG)
	outbox := wsql.DefaultPostgreSQLSchema{}.MessagesTable(spec.Outbox)
	offsets := wsql.DefaultPostgreSQLOffsetsAdapter{}.MessagesOffsetsTable(spec.Outbox)
	t.Cleanup(func() {
		for _, tb := range []string{spec.S2Table, spec.S3Table, spec.S2Table + "_order", spec.S3Table + "_order", spec.S2Table + "_effects", spec.S3Table + "_effects", outbox, offsets} {
			if _, err := db.Exec("DROP TABLE IF EXISTS " + tb); err != nil {
				t.Errorf("dropping %s: %v", tb, err)
			}
		}
	})
	for _, tb := range []string{spec.S2Table, spec.S3Table} {
		open(t, withParams(t, spec.PG, "table", tb, "migrate", "true"))
	}
	effects2 = newTableLedger(t, db, spec.S2Table+"_effects")
	effects3 = newTableLedger(t, db, spec.S3Table+"_effects")
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		ConsumerGroup: "forwarder", SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.SubscribeInitialize(spec.Outbox); err != nil {
		t.Fatalf("creating the SQL outbox: %v", err)
	}
	return effects2, effects3
}

// prepareRedis sets stage 1's store URL: Redis under a key prefix of its
// own, through a fault proxy; the keys are deleted when the test ends.
func prepareRedis(t *testing.T, spec *pipelineSpec, redisURL, u string) *faultproxy.Proxy {
	t.Helper()
	prefix := "e2e:pl:" + u + ":"
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c := redis.NewClient(opts)
		defer c.Close()
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 500).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
	raw, err := url.Parse(withParams(t, redisURL, "prefix", prefix, "retention", "1h"))
	if err != nil {
		t.Fatal(err)
	}
	p := faultproxy.New(t, raw.Host)
	raw.Host = p.Addr()
	spec.Redis = raw.String()
	return p
}
