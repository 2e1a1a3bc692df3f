package readme_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	inboxmw "github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
)

// The README's snippets (snippets_test.go) run, each against the memory
// store or a real service, and do what the README says they do; every
// function of snippets_test.go is run here.

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newGoChannel(t *testing.T) *gochannel.GoChannel {
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pubSub.Close() })
	return pubSub
}

func newRouter(t *testing.T) *message.Router {
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// runRouter runs r until the test ends.
func runRouter(t *testing.T, r *message.Router) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case <-r.Running():
	case err := <-done:
		t.Fatalf("router stopped at start: %v", err)
	}
	t.Cleanup(func() {
		_ = r.Close()
		<-done
	})
}

func newMemory(t *testing.T) *memory.Store {
	s, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// receive returns the next message of topic on sub, or fails after a
// minute.
func receive(t *testing.T, msgs <-chan *message.Message, what string) *message.Message {
	t.Helper()
	select {
	case m := <-msgs:
		m.Ack()
		return m
	case <-time.After(time.Minute):
		t.Fatalf("no %s after a minute", what)
		return nil
	}
}

// pollUntil calls f until it is true, or fails after a minute.
func pollUntil(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not true after a minute", what)
		}
		time.Sleep(10 * time.Millisecond) // polling, not synchronisation
	}
}

// recordingPublisher keeps what it is given.
type recordingPublisher struct {
	mu     sync.Mutex
	topics []string
}

func (p *recordingPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for range msgs {
		p.topics = append(p.topics, topic)
	}
	return nil
}

func (p *recordingPublisher) Close() error { return nil }

func (p *recordingPublisher) published() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.topics...)
}

func TestSnippets_run(t *testing.T) {
	t.Run("every_snippet_is_run", func(t *testing.T) {
		t.Parallel()
		fset := token.NewFileSet()
		snippets, err := parser.ParseFile(fset, "snippets_test.go", nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		run, err := parser.ParseFile(fset, "snippets_run_test.go", nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		called := map[string]bool{}
		ast.Inspect(run, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok {
				if id, ok := c.Fun.(*ast.Ident); ok {
					called[id.Name] = true
				}
			}
			return true
		})
		n := 0
		for _, d := range snippets.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil {
				n++
				if !called[fn.Name.Name] {
					t.Errorf("the snippet %s of snippets_test.go is not run by TestSnippets_run", fn.Name.Name)
				}
			}
		}
		if n < 6 {
			t.Fatalf("snippets_test.go has %d functions: is the parser still finding them?", n)
		}
	})

	// Quick start: the inbox on the memory store goes into a router and
	// closes.
	t.Run("quickStart", func(t *testing.T) {
		t.Parallel()
		if err := quickStart(ctxT(t), newRouter(t)); err != nil {
			t.Fatal(err)
		}
	})

	// The order of the middlewares: Retry inside the inbox, so a handler
	// that fails twice, then succeeds, runs three times under one claim (one
	// attempt); Recoverer inside it too, so a panic becomes an error that
	// gives the lease back (the key is not processed, its attempt ended),
	// which the poison queue outside takes, as it is not transient.
	t.Run("middlewareOrder", func(t *testing.T) {
		t.Parallel()
		store := newMemory(t)
		ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "rabbit", Group: "billing"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ib.Close(context.Background()) })
		poisoned := &recordingPublisher{}
		poisonQueue, err := poisonFilter(poisoned)
		if err != nil {
			t.Fatal(err)
		}
		pubSub := newGoChannel(t)
		r := newRouter(t)
		middlewareOrder(r, ib, poisonQueue)
		var mu sync.Mutex
		runs := map[string]int{}
		r.AddConsumerHandler("charge", "orders", pubSub, func(msg *message.Message) error {
			mu.Lock()
			runs[msg.UUID]++
			n := runs[msg.UUID]
			mu.Unlock()
			switch {
			case msg.UUID == "order-panics":
				panic("the gateway's client panicked")
			case n < 3:
				return errors.New("gateway timeout")
			}
			return nil
		})
		runRouter(t, r)
		for _, id := range []string{"order-1", "order-panics"} {
			if err := pubSub.Publish("orders", message.NewMessage(id, []byte("42"))); err != nil {
				t.Fatal(err)
			}
		}
		pollUntil(t, "order-1 to be processed", func() bool {
			rec, err := store.Get(context.Background(), "rabbit:billing:charge:order-1")
			return err == nil && rec.State == inbox.StateProcessed
		})
		pollUntil(t, "order-panics to be poisoned", func() bool { return len(poisoned.published()) == 1 })
		rec, _ := store.Get(context.Background(), "rabbit:billing:charge:order-1")
		panicked, _ := store.Get(context.Background(), "rabbit:billing:charge:order-panics")
		mu.Lock()
		defer mu.Unlock()
		if runs["order-1"] != 3 || rec.Attempts != 1 {
			t.Errorf("order-1: the handler ran %d times, the key's attempts %d; want 3 runs in 1 attempt", runs["order-1"], rec.Attempts)
		}
		if runs["order-panics"] != 1 || panicked.State != inbox.StateAvailable || panicked.Attempts != 1 {
			t.Errorf("order-panics: ran %d times, record %+v; want 1 run, its lease given back unmarked", runs["order-panics"], panicked)
		}
	})

	// The poison queue's filter lets the inbox's transient errors through
	// (the broker redelivers), those its comment names, context errors
	// included (a handler's timeout), and poisons the others.
	t.Run("poisonFilter", func(t *testing.T) {
		t.Parallel()
		pub := &recordingPublisher{}
		poisonQueue, err := poisonFilter(pub)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			err      error
			poisoned bool
		}{
			{&inbox.BusyError{Key: "k"}, false},
			{inbox.ErrStoreUnavailable, false},
			{inbox.ErrClosed, false},
			{&inbox.AttemptError{Key: "k", Attempt: 1, MaxAttempts: 3, Err: errors.New("x")}, false},
			{context.Canceled, false},
			{fmt.Errorf("payment gateway: %w", context.DeadlineExceeded), false},
			{&inbox.DeadError{Key: "k", Attempts: 3, Reason: "x", Err: context.DeadlineExceeded}, true},
			{&inbox.DeadError{Key: "k", Attempts: 3, Reason: "x"}, true},
			{errors.New("a malformed order"), true},
		} {
			before := len(pub.published())
			msg := message.NewMessage(watermill.NewUUID(), nil)
			_, got := poisonQueue(func(*message.Message) ([]*message.Message, error) { return nil, tc.err })(msg)
			poisoned := len(pub.published()) > before
			if poisoned != tc.poisoned || (got == nil) != tc.poisoned {
				t.Errorf("%v: poisoned %v, returned %v; want poisoned %v", tc.err, poisoned, got, tc.poisoned)
			}
		}
	})

	// MaxAttempts with a poison queue: a dead key's message goes to
	// billing.poison and is acked (here a permanent error makes it dead at
	// once, without waiting out backoffs).
	t.Run("maxAttempts", func(t *testing.T) {
		t.Parallel()
		pubSub := newGoChannel(t)
		poison, err := pubSub.Subscribe(ctxT(t), "billing.poison")
		if err != nil {
			t.Fatal(err)
		}
		store := newMemory(t)
		r := newRouter(t)
		if err := maxAttempts(r, store, pubSub); err != nil {
			t.Fatal(err)
		}
		r.AddConsumerHandler("charge", "orders", pubSub, func(*message.Message) error {
			return inbox.Permanent(errors.New("a malformed order"))
		})
		runRouter(t, r)
		if err := pubSub.Publish("orders", message.NewMessage("order-2", []byte("?"))); err != nil {
			t.Fatal(err)
		}
		if m := receive(t, poison, "message on billing.poison"); m.UUID != "order-2" {
			t.Fatalf("billing.poison got %s, want order-2", m.UUID)
		}
		rec, err := store.Get(context.Background(), "kafka:billing:charge:order-2")
		if err != nil || rec.State != inbox.StateDead {
			t.Fatalf("record %+v, %v; want the key dead", rec, err)
		}
	})

	// Stores: the store of INBOX_STORE_URL opens, here the shared Redis
	// under a prefix of the test's own (t.Setenv: not parallel).
	t.Run("openStore", func(t *testing.T) {
		u, err := url.Parse(testenv.Redis.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("prefix", "readme-snippet-"+inbox.NewLeaseID()+":")
		q.Set("retention", "72h")
		u.RawQuery = q.Encode()
		t.Setenv("INBOX_STORE_URL", u.String())
		if err := openStore(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		t.Setenv("INBOX_STORE_URL", "redis://127.0.0.1:1/0")
		if err := openStore(ctxT(t)); !errors.Is(err, inbox.ErrStoreUnavailable) {
			t.Fatalf("openStore of a Redis that does not answer: %v, want ErrStoreUnavailable", err)
		}
	})

	// The transactional mode on PostgreSQL (in a schema of the test's own):
	// the handler's write and the mark commit together; a duplicate is
	// acked without a second write.
	t.Run("transactional", func(t *testing.T) {
		t.Parallel()
		base := testenv.Postgres.URL(t)
		admin, err := sql.Open("pgx", base)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.Close() })
		schema := "readme_" + inbox.NewLeaseID()[:12]
		if _, err := admin.ExecContext(ctxT(t), "CREATE SCHEMA "+schema); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
		u, err := url.Parse(base)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		db, err := sql.Open("pgx", u.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		ddl, err := sqlstore.DDL(sqlstore.Postgres, sqlstore.DefaultTable)
		if err != nil {
			t.Fatal(err)
		}
		for _, stmt := range []string{ddl, "CREATE TABLE charges (order_id TEXT NOT NULL)"} {
			if _, err := db.ExecContext(ctxT(t), stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
		pubSub := newGoChannel(t)
		r := newRouter(t)
		if err := transactional(db, r, pubSub); err != nil {
			t.Fatal(err)
		}
		runRouter(t, r)
		msg := message.NewMessage("order-3", []byte("order-3"))
		for range 2 {
			if err := pubSub.Publish("orders", msg.Copy()); err != nil {
				t.Fatal(err)
			}
		}
		charges := func() (n int) {
			_ = db.QueryRowContext(context.Background(), "SELECT count(*) FROM charges WHERE order_id = 'order-3'").Scan(&n)
			return n
		}
		var state int
		pollUntil(t, "the charge and the mark to commit", func() bool {
			return charges() == 1 && db.QueryRowContext(context.Background(), "SELECT state FROM inbox WHERE msg_key = 'rabbit:billing:charge:order-3'").Scan(&state) == nil
		})
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		if n := charges(); n != 1 {
			t.Fatalf("%d charges for one order delivered twice, want 1", n)
		}
	})
}
