package txinbox_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
	inboxmw "github.com/watermill-inbox/inbox/middleware"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	"github.com/watermill-inbox/inbox/stores/sql/txinbox"
)

// txEnv is one transactional test's database: an inbox table and an effects
// table without a unique constraint, so a duplicate effect would show.
type txEnv struct {
	b       backend
	db      *sql.DB
	table   string
	effects string
	store   *sqlstore.Store // a lease store on the same table, to read records
}

func newTxEnv(t *testing.T, b backend, db *sql.DB) *txEnv {
	t.Helper()
	e := &txEnv{b: b, db: db, table: newTable(t, db, b.dialect)}
	e.effects = e.table + "_effects"
	if _, err := db.ExecContext(ctxT(t), "CREATE TABLE "+e.effects+" (msg_id VARCHAR(255) NOT NULL, note VARCHAR(255) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+e.effects) })
	s, err := sqlstore.New(ctxT(t), db, sqlstore.Options{Dialect: b.dialect, Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	e.store = s
	return e
}

// ph is the dialect's n-th placeholder.
func ph(d sqlstore.Dialect, n int) string {
	if d == sqlstore.Postgres {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

// writeEffect is what a handler does: write a row through the middleware's
// transaction.
func (e *txEnv) writeEffect(msg *message.Message, note string) error {
	tx, ok := txinbox.TxFromContext(msg.Context())
	if !ok {
		return errors.New("no transaction in the handler's context")
	}
	_, err := tx.ExecContext(msg.Context(), "INSERT INTO "+e.effects+" (msg_id, note) VALUES ("+ph(e.b.dialect, 1)+", "+ph(e.b.dialect, 2)+")", msg.UUID, note)
	return err
}

func (e *txEnv) effectCount(t testing.TB, msgID string) int {
	t.Helper()
	return countRows(t, e.db, e.effects, "msg_id = '"+msgID+"'")
}

// middleware returns the inbox middleware over a transactional store on the
// test's table: tc with DB, Dialect and Table filled in, mc with Store, Bus
// "test", Group "group" and (unless set) Alias "handler".
func (e *txEnv) middleware(t testing.TB, tc txinbox.Config, mc inboxmw.Config) *inboxmw.Inbox {
	t.Helper()
	tc.DB, tc.Dialect, tc.Table = e.db, e.b.dialect, e.table
	txs, err := txinbox.New(tc)
	if err != nil {
		t.Fatal(err)
	}
	mc.Store, mc.Bus, mc.Group = txs, "test", "group"
	if mc.Alias == nil {
		mc.Alias = keying.StaticAlias("handler")
	}
	ib, err := inboxmw.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := ib.Close(ctx); err != nil {
			t.Errorf("closing the middleware: %v", err)
		}
		_ = txs.Close()
	})
	return ib
}

// keyOf is the key the middleware gives msg in these tests.
func keyOf(msg *message.Message) string { return "test:group:handler:" + msg.UUID }

func newMsg() *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte("payload"))
	msg.SetContext(context.Background())
	return msg
}

func forTx(t *testing.T, f func(t *testing.T, e *txEnv)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			if b.dialect != sqlstore.SQLite {
				db.SetMaxOpenConns(32)
			}
			f(t, newTxEnv(t, b, db))
		})
	}
}

func TestTx_handler_failure_rolls_back_its_write_and_the_mark(t *testing.T) {
	forTx(t, func(t *testing.T, e *txEnv) {
		ib := e.middleware(t, txinbox.Config{}, inboxmw.Config{})
		msg := newMsg()
		boom := errors.New("boom")
		_, err := ib.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			if err := e.writeEffect(msg, "failed"); err != nil {
				return nil, err
			}
			return nil, boom
		})(msg)
		if !errors.Is(err, boom) {
			t.Fatalf("middleware returned %v, want the handler's error", err)
		}
		if n := e.effectCount(t, msg.UUID); n != 0 {
			t.Fatalf("%d effect rows after a failed handler, want 0 (rolled back)", n)
		}
		if r, err := e.store.Get(ctxT(t), keyOf(msg)); err != nil || r.State != inbox.StateNotFound {
			t.Fatalf("key after a failed handler: %+v, %v; want NotFound", r, err)
		}
		// The redelivery runs the handler and commits.
		calls := 0
		if _, err := ib.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			calls++
			return nil, e.writeEffect(msg, "ok")
		})(msg); err != nil || calls != 1 {
			t.Fatalf("redelivery: %v, %d handler calls", err, calls)
		}
		if n := e.effectCount(t, msg.UUID); n != 1 {
			t.Fatalf("%d effect rows after the redelivery, want 1", n)
		}
	})
}

func TestTx_handler_success_commits_its_write_and_the_mark(t *testing.T) {
	forTx(t, func(t *testing.T, e *txEnv) {
		ib := e.middleware(t, txinbox.Config{}, inboxmw.Config{})
		msg := newMsg()
		var calls atomic.Int32
		h := ib.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			calls.Add(1)
			return nil, e.writeEffect(msg, "ok")
		})
		for i := range 3 {
			if out, err := h(msg); err != nil || out != nil {
				t.Fatalf("delivery %d: %v, %v", i+1, out, err)
			}
		}
		if calls.Load() != 1 {
			t.Fatalf("handler ran %d times for 3 deliveries, want 1", calls.Load())
		}
		if n := e.effectCount(t, msg.UUID); n != 1 {
			t.Fatalf("%d effect rows, want 1", n)
		}
		ok, err := e.store.IsProcessed(ctxT(t), keyOf(msg))
		if err != nil || !ok {
			t.Fatalf("IsProcessed after the commit = %v, %v", ok, err)
		}
	})
}

func TestTx_20_concurrent_duplicates_one_effect(t *testing.T) {
	forTx(t, func(t *testing.T, e *txEnv) {
		ib := e.middleware(t, txinbox.Config{LockTimeout: 60 * time.Second}, inboxmw.Config{})
		orig := newMsg()
		var calls atomic.Int32
		h := ib.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			calls.Add(1)
			return nil, e.writeEffect(msg, "ok")
		})
		start := make(chan struct{})
		errs := make([]error, 20)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				msg := orig.Copy()
				msg.SetContext(context.Background())
				<-start
				_, errs[i] = h(msg)
			}()
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("duplicates failed: %v", err)
		}
		if n := e.effectCount(t, orig.UUID); n != 1 || calls.Load() != 1 {
			t.Fatalf("%d effect rows and %d handler runs for 20 concurrent duplicates, want 1 and 1", n, calls.Load())
		}
	})
}

func TestTx_duplicate_waits_for_the_claim_then_busy_or_takes_over(t *testing.T) {
	forTx(t, func(t *testing.T, e *txEnv) {
		// LockTimeout is whole seconds on MySQL/MariaDB.
		ib := e.middleware(t, txinbox.Config{LockTimeout: time.Second}, inboxmw.Config{})
		msg := newMsg()
		entered, leave := make(chan struct{}), make(chan error)
		holderDone := make(chan error, 1)
		go func() {
			_, err := ib.Middleware(func(m *message.Message) ([]*message.Message, error) {
				if err := e.writeEffect(m, "holder"); err != nil {
					return nil, err
				}
				close(entered)
				return nil, <-leave
			})(msg.Copy())
			holderDone <- err
		}()
		<-entered

		dupCalls := 0
		dup := ib.Middleware(func(m *message.Message) ([]*message.Message, error) {
			dupCalls++
			return nil, e.writeEffect(m, "duplicate")
		})
		began := time.Now()
		_, err := dup(msg.Copy())
		var busy *inbox.BusyError
		if !errors.Is(err, inbox.ErrBusy) || !errors.As(err, &busy) || busy.Key != keyOf(msg) {
			t.Fatalf("duplicate while the claim is uncommitted: %v, want a BusyError for %q", err, keyOf(msg))
		}
		if waited := time.Since(began); waited < 900*time.Millisecond {
			t.Fatalf("duplicate gave up after %s, want to wait the 1s lock timeout", waited)
		}

		// The holder fails: a duplicate waiting at that moment takes over.
		dupDone := make(chan error, 1)
		ibLong := e.middleware(t, txinbox.Config{LockTimeout: 60 * time.Second}, inboxmw.Config{})
		go func() {
			_, err := ibLong.Middleware(func(m *message.Message) ([]*message.Message, error) {
				dupCalls++
				return nil, e.writeEffect(m, "duplicate")
			})(msg.Copy())
			dupDone <- err
		}()
		leave <- errors.New("holder fails")
		if err := <-holderDone; err == nil {
			t.Fatal("the holder's failure was not returned")
		}
		if err := <-dupDone; err != nil {
			t.Fatalf("waiting duplicate after the holder rolled back: %v", err)
		}
		if dupCalls != 1 {
			t.Fatalf("duplicate handler ran %d times, want 1", dupCalls)
		}
		var notes []string
		rows, err := e.db.QueryContext(ctxT(t), "SELECT note FROM "+e.effects)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var n string
			_ = rows.Scan(&n)
			notes = append(notes, n)
		}
		_ = rows.Close()
		if len(notes) != 1 || notes[0] != "duplicate" {
			t.Fatalf("effects %v, want only the duplicate's", notes)
		}
	})
}

func TestTx_panic_rolls_back_and_is_reraised(t *testing.T) {
	forTx(t, func(t *testing.T, e *txEnv) {
		ib := e.middleware(t, txinbox.Config{}, inboxmw.Config{})
		msg := newMsg()
		func() {
			defer func() {
				if r := recover(); r != "handler panic" {
					t.Fatalf("recovered %v, want the handler's panic", r)
				}
			}()
			_, _ = ib.Middleware(func(m *message.Message) ([]*message.Message, error) {
				if err := e.writeEffect(m, "panicked"); err != nil {
					return nil, err
				}
				panic("handler panic")
			})(msg)
		}()
		if n := e.effectCount(t, msg.UUID); n != 0 {
			t.Fatalf("%d effect rows after a panic, want 0", n)
		}
		if r, err := e.store.Get(ctxT(t), keyOf(msg)); err != nil || r.State != inbox.StateNotFound {
			t.Fatalf("key after a panic: %+v, %v", r, err)
		}
	})
}

// Messages a handler returns: without an outbox they are refused and nothing
// commits; with one they commit with the mark and the router gets none, so a
// failing publish cannot lose them.
func TestTx_returned_messages_outbox_or_refusal(t *testing.T) {
	forTx(t, func(t *testing.T, e *txEnv) {
		outbox := e.table + "_outbox"
		if _, err := e.db.ExecContext(ctxT(t), "CREATE TABLE "+outbox+" (uuid VARCHAR(64) NOT NULL, payload VARCHAR(255) NOT NULL)"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = e.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+outbox) })
		produce := func(m *message.Message) ([]*message.Message, error) {
			if err := e.writeEffect(m, "ok"); err != nil {
				return nil, err
			}
			return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("out-1")), message.NewMessage(watermill.NewUUID(), []byte("out-2"))}, nil
		}

		// No outbox: refused, rolled back.
		msg := newMsg()
		_, err := e.middleware(t, txinbox.Config{}, inboxmw.Config{}).Middleware(produce)(msg)
		if !errors.Is(err, txinbox.ErrMessagesReturned) {
			t.Fatalf("handler returning messages without an outbox: %v, want ErrMessagesReturned", err)
		}
		if n := e.effectCount(t, msg.UUID); n != 0 {
			t.Fatalf("%d effect rows after the refusal, want 0", n)
		}
		if ok, _ := e.store.IsProcessed(ctxT(t), keyOf(msg)); ok {
			t.Fatal("key marked after the refusal")
		}

		// An outbox in the same transaction.
		failOutbox := true
		ib := e.middleware(t, txinbox.Config{Outbox: func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) error {
			for _, m := range msgs {
				if _, err := tx.ExecContext(ctx, "INSERT INTO "+outbox+" (uuid, payload) VALUES ("+ph(e.b.dialect, 1)+", "+ph(e.b.dialect, 2)+")", m.UUID, string(m.Payload)); err != nil {
					return err
				}
			}
			if failOutbox {
				return errors.New("outbox write failed")
			}
			return nil
		}}, inboxmw.Config{})
		if _, err := ib.Middleware(produce)(msg); err == nil || !strings.Contains(err.Error(), "outbox write failed") {
			t.Fatalf("failing outbox: %v", err)
		}
		if n := countRows(t, e.db, outbox, "1 = 1"); n != 0 || e.effectCount(t, msg.UUID) != 0 {
			t.Fatalf("a failed outbox write left %d outbox rows and %d effects", n, e.effectCount(t, msg.UUID))
		}
		failOutbox = false
		out, err := ib.Middleware(produce)(msg)
		if err != nil || len(out) != 0 {
			t.Fatalf("with an outbox: %d messages for the router, %v; want none, nil", len(out), err)
		}
		if n := countRows(t, e.db, outbox, "payload IN ('out-1', 'out-2')"); n != 2 || e.effectCount(t, msg.UUID) != 1 {
			t.Fatalf("after commit: %d outbox rows, %d effects; want 2 and 1", n, e.effectCount(t, msg.UUID))
		}
		if ok, _ := e.store.IsProcessed(ctxT(t), keyOf(msg)); !ok {
			t.Fatal("key not marked after the commit with the outbox")
		}
	})
}

func TestConfig_validation(t *testing.T) {
	t.Parallel()
	_, err := txinbox.New(txinbox.Config{Table: "x;y", Dialect: "oracle", Retention: time.Microsecond, LockTimeout: -time.Second, Owner: "bad\x00owner"})
	for _, want := range []string{"DB is required", "Dialect", `"oracle"`, "Table", `"x;y"`, "Retention 1µs", "LockTimeout -1s", `Owner "bad\x00owner"`} {
		if !errors.Is(err, inbox.ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
			t.Errorf("New with a bad config: %v, want ErrInvalidArgument naming %q", err, want)
		}
	}
	db := openSQLite(t)
	if _, err := txinbox.New(txinbox.Config{DB: db, Dialect: sqlstore.SQLite}); err != nil {
		t.Fatalf("New with DB and Dialect only (defaults for the rest): %v", err)
	}
	if err := (txinbox.Config{DB: db, Dialect: sqlstore.SQLite}).Validate(); err == nil || !strings.Contains(err.Error(), "LockTimeout 0s") {
		t.Fatalf("Validate before defaults: %v, want LockTimeout named", err)
	}
}

// ---- a process killed between the handler's write and the commit ----

const helperEnv = "INBOX_SQL_TX_HELPER"

// TestTxHelperProcess is the child of TestTx_process_killed_before_commit: it
// claims a message, writes the effect, says so on stdout and waits to be
// killed. It does nothing in a normal test run.
func TestTxHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("helper process for TestTx_process_killed_before_commit")
	}
	var b backend
	for _, c := range backends {
		if c.name == os.Getenv(helperEnv) {
			b = c
		}
	}
	var db *sql.DB
	if b.dialect == sqlstore.SQLite {
		db = openSQLiteFile(t, os.Getenv(helperEnv+"_FILE"))
	} else {
		db = b.open(t)
	}
	e := &txEnv{b: b, db: db, table: os.Getenv(helperEnv + "_TABLE")}
	e.effects = e.table + "_effects"
	msg := newMsg()
	msg.UUID = os.Getenv(helperEnv + "_UUID")
	_, _ = e.middleware(t, txinbox.Config{}, inboxmw.Config{}).Middleware(func(m *message.Message) ([]*message.Message, error) {
		if err := e.writeEffect(m, "child"); err != nil {
			fmt.Println("error:", err)
			return nil, err
		}
		fmt.Println("effect-written")
		select {} // killed here, before the commit
	})(msg)
}

func TestTx_process_killed_before_commit(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			var (
				db   *sql.DB
				file string
			)
			if b.dialect == sqlstore.SQLite {
				file = sqliteFile(t)
				db = openSQLiteFile(t, file)
			} else {
				db = b.open(t)
			}
			e := newTxEnv(t, b, db)
			msg := newMsg()

			cmd := exec.Command(os.Args[0], "-test.run=^TestTxHelperProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), helperEnv+"="+b.name, helperEnv+"_TABLE="+e.table, helperEnv+"_UUID="+msg.UUID, helperEnv+"_FILE="+file)
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			lines := make(chan string)
			go func() {
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
			timeout := time.After(2 * time.Minute)
		wait:
			for {
				select {
				case l, ok := <-lines:
					if !ok {
						t.Fatal("the child exited before writing the effect")
					}
					if strings.HasPrefix(l, "error:") {
						t.Fatalf("child: %s", l)
					}
					if l == "effect-written" {
						break wait
					}
				case <-timeout:
					t.Fatal("the child did not write the effect within 2 minutes")
				}
			}
			if err := cmd.Process.Kill(); err != nil { // SIGKILL: no deferred rollback runs
				t.Fatal(err)
			}
			_ = cmd.Wait()

			if n := e.effectCount(t, msg.UUID); n != 0 {
				t.Fatalf("%d effect rows after the child was killed before its commit, want 0", n)
			}
			// The redelivery waits, if need be, for the server to notice the
			// dead connection and roll its transaction back, then applies
			// the effect once.
			ib := e.middleware(t, txinbox.Config{LockTimeout: 60 * time.Second}, inboxmw.Config{})
			calls := 0
			h := ib.Middleware(func(m *message.Message) ([]*message.Message, error) {
				calls++
				return nil, e.writeEffect(m, "redelivery")
			})
			for i := range 2 {
				if _, err := h(msg.Copy()); err != nil {
					t.Fatalf("redelivery %d: %v", i+1, err)
				}
			}
			if n := e.effectCount(t, msg.UUID); n != 1 || calls != 1 {
				t.Fatalf("after two redeliveries: %d effect rows, %d handler runs; want 1 and 1", n, calls)
			}
			if ok, err := e.store.IsProcessed(ctxT(t), keyOf(msg)); err != nil || !ok {
				t.Fatalf("IsProcessed after the redelivery = %v, %v", ok, err)
			}
		})
	}
}

func TestTx_keys_from_keying_id_sources(t *testing.T) {
	forTx(t, func(t *testing.T, e *txEnv) {
		ib := e.middleware(t, txinbox.Config{}, inboxmw.Config{})
		var calls atomic.Int32
		h := ib.Middleware(func(m *message.Message) ([]*message.Message, error) {
			calls.Add(1)
			return nil, e.writeEffect(m, "ok")
		})
		// Two messages (producer retry: new UUID) with one IdempotencyKey.
		for range 2 {
			msg := newMsg()
			msg.Metadata.Set(keying.DefaultIDMetadataKey, "order-42")
			if _, err := h(msg); err != nil {
				t.Fatal(err)
			}
		}
		if calls.Load() != 1 {
			t.Fatalf("handler ran %d times for two messages with one IdempotencyKey, want 1", calls.Load())
		}
		if ok, err := e.store.IsProcessed(ctxT(t), "test:group:handler:order-42"); err != nil || !ok {
			t.Fatalf("IsProcessed(test:group:handler:order-42) = %v, %v", ok, err)
		}

		// No id from any source, MissingKeyReject: refused, nothing runs.
		noID := []keying.IDSource{keying.FromMetadata("absent")}
		strict := e.middleware(t, txinbox.Config{}, inboxmw.Config{IDSources: noID, MissingKey: inboxmw.MissingKeyReject})
		_, err := strict.Middleware(func(m *message.Message) ([]*message.Message, error) {
			t.Error("handler ran for a message without a key")
			return nil, nil
		})(newMsg())
		if !errors.Is(err, inbox.ErrNoKey) {
			t.Fatalf("message without a key: %v, want ErrNoKey", err)
		}

		// The default, MissingKeyProcess: the handler runs in a transaction
		// of its own, every time, and its write commits.
		lax := e.middleware(t, txinbox.Config{}, inboxmw.Config{IDSources: noID})
		var laxCalls atomic.Int32
		h = lax.Middleware(func(m *message.Message) ([]*message.Message, error) {
			if _, ok := txinbox.TxFromContext(m.Context()); !ok {
				t.Error("no transaction in the context of a message without a key")
			}
			laxCalls.Add(1)
			return nil, e.writeEffect(m, "no-key")
		})
		for range 2 {
			msg := newMsg()
			if _, err := h(msg); err != nil {
				t.Fatalf("message without a key under MissingKeyProcess: %v", err)
			}
			if n := e.effectCount(t, msg.UUID); n != 1 {
				t.Fatalf("the handler's write for a message without a key: %d rows after commit, want 1", n)
			}
		}
		if laxCalls.Load() != 2 {
			t.Fatalf("handler ran %d times for two messages without a key, want 2 (no deduplication)", laxCalls.Load())
		}
	})
}

// handOff is an inboxmw.Redeliverer that publishes the copy back to its
// topic at once, recording each hand-off's delay and attempts.
type handOff struct {
	pub message.Publisher

	mu       sync.Mutex
	delays   []time.Duration
	attempts []string
}

func (h *handOff) Redeliver(_ context.Context, topic string, msg *message.Message, delay time.Duration) error {
	h.mu.Lock()
	h.delays = append(h.delays, delay)
	h.attempts = append(h.attempts, msg.Metadata.Get(inboxmw.MetadataAttempts))
	h.mu.Unlock()
	return h.pub.Publish(topic, msg)
}

// In the transactional mode a failed handler rolls back, then the message is
// handed to Config.Redelivery with the backoff of its attempt, counted by
// the copies (the store counts none); the copy commits once.
func TestTx_failed_handler_rolls_back_then_hands_off(t *testing.T) {
	forTx(t, func(t *testing.T, e *txEnv) {
		ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, watermill.NopLogger{})
		t.Cleanup(func() { _ = ps.Close() })
		broker := &handOff{pub: ps}
		ib := e.middleware(t, txinbox.Config{}, inboxmw.Config{Redelivery: broker, Backoff: func(n int) time.Duration {
			return time.Duration(n) * time.Second
		}})
		r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		var calls, nacks atomic.Int32
		r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := h(msg)
				if err != nil {
					nacks.Add(1)
				}
				return out, err
			}
		}, ib.Middleware)
		r.AddConsumerHandler("handler", "orders", ps, func(msg *message.Message) error {
			if err := e.writeEffect(msg, "attempt"); err != nil {
				return err
			}
			if calls.Add(1) <= 2 {
				return errors.New("downstream timeout")
			}
			return nil
		})
		go func() { _ = r.Run(context.Background()) }()
		<-r.Running()
		t.Cleanup(func() { _ = r.Close() })
		msg := newMsg()
		if err := ps.Publish("orders", msg); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for e.effectCount(t, msg.UUID) == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := e.effectCount(t, msg.UUID); n != 1 || calls.Load() != 3 || nacks.Load() != 0 {
			t.Fatalf("%d effect rows after %d runs, %d nacks; want 1 after 3, 0", n, calls.Load(), nacks.Load())
		}
		broker.mu.Lock()
		defer broker.mu.Unlock()
		if fmt.Sprint(broker.delays) != "[1s 2s]" || fmt.Sprint(broker.attempts) != "[1 2]" {
			t.Fatalf("hand-offs with delays %v and attempts %v, want [1s 2s] and [1 2]", broker.delays, broker.attempts)
		}
		if ok, err := e.store.IsProcessed(ctxT(t), keyOf(msg)); err != nil || !ok {
			t.Fatalf("IsProcessed = %v, %v", ok, err)
		}
	})
}
