package txinbox_test

import (
	"errors"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	inboxmw "github.com/watermill-inbox/inbox/middleware"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	"github.com/watermill-inbox/inbox/stores/sql/txinbox"
)

// What the package doc and the README say of this mode, held to what it
// does (issue 30).

// packageDoc returns the package's doc, as one line.
func packageDoc(t *testing.T) string {
	t.Helper()
	fset := token.NewFileSet()
	var files []*ast.File
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, "github.com/watermill-inbox/inbox/stores/sql/txinbox")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(strings.Fields(p.Doc), " ")
}

// Every database bounds the wait for a pooled connection by LockTimeout
// (the package doc said SQLite's only): with the pool's one connection
// held by a claim, another claim fails after LockTimeout, with ErrBusy on
// SQLite (its one connection is its writer) and ErrStoreUnavailable on the
// others (a pool too small for the router's concurrency).
func TestBeginTx_connection_wait_bounded_by_LockTimeout_on_every_database(t *testing.T) {
	if !regexp.MustCompile(`[^.]*connections?[^.]*on every database[^.]*Config\.LockTimeout`).MatchString(packageDoc(t)) {
		t.Error("the package doc does not say that on every database the wait for a pooled connection is bounded by LockTimeout")
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			e := newTxEnv(t, b, db)
			db.SetMaxOpenConns(1)
			const lockTimeout = time.Second // whole seconds on MySQL and MariaDB
			s := e.txStore(t, txinbox.Config{LockTimeout: lockTimeout})
			held, err := s.BeginTx(ctxT(t), "test:group:handler:held")
			if err != nil || held.Status != inbox.Acquired {
				t.Fatalf("BeginTx = %+v, %v; want Acquired", held, err)
			}
			t.Cleanup(func() { _ = held.Finish(nil, nil) })

			began := time.Now()
			c, err := s.BeginTx(ctxT(t), "test:group:handler:other")
			waited := time.Since(began)
			if c.Finish != nil {
				_ = c.Finish(nil, errors.New("unexpected claim"))
			}
			want := inbox.ErrStoreUnavailable
			if b.dialect == sqlstore.SQLite {
				want = inbox.ErrBusy
			}
			if !errors.Is(err, want) {
				t.Fatalf("BeginTx while the pool's one connection is held: %v, want an error wrapping %v", err, want)
			}
			// At least the lock timeout; at most it plus a margin for a
			// loaded machine (the wait is for a connection, bounded).
			if waited < lockTimeout-50*time.Millisecond || waited > lockTimeout+20*time.Second {
				t.Fatalf("BeginTx gave up after %s, want the lock timeout of %s", waited, lockTimeout)
			}
		})
	}
}

// The wait for a concurrent delivery's claim is LockTimeout's, not the
// middleware's MaxBusyWait (the README's busy row said "capped by
// MaxBusyWait").
func TestTx_wait_on_a_concurrent_claim_is_not_capped_by_MaxBusyWait(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if row := regexp.MustCompile(`(?m)^\| \*\*busy\*\*.*$`).Find(readme); !strings.Contains(string(row), "LockTimeout") {
		t.Errorf("the README's busy row does not say what bounds the wait in the transactional mode (LockTimeout): %q", row)
	}
	forTx(t, func(t *testing.T, e *txEnv) {
		const lockTimeout = time.Second
		ib := e.middleware(t, txinbox.Config{LockTimeout: lockTimeout}, inboxmw.Config{MaxBusyWait: 10 * time.Millisecond})
		msg := newMsg()
		entered, leave := make(chan struct{}), make(chan struct{})
		holderDone := make(chan error, 1)
		go func() {
			_, err := ib.Middleware(func(*message.Message) ([]*message.Message, error) {
				close(entered)
				<-leave
				return nil, nil
			})(msg.Copy())
			holderDone <- err
		}()
		<-entered
		began := time.Now()
		_, err := ib.Middleware(func(*message.Message) ([]*message.Message, error) {
			return nil, errors.New("the duplicate's handler ran")
		})(msg.Copy())
		waited := time.Since(began)
		close(leave)
		if err := <-holderDone; err != nil {
			t.Fatalf("holder: %v", err)
		}
		if !errors.Is(err, inbox.ErrBusy) {
			t.Fatalf("duplicate while the claim is uncommitted: %v, want ErrBusy", err)
		}
		if waited < lockTimeout-50*time.Millisecond {
			t.Fatalf("the duplicate gave up after %s: MaxBusyWait (10ms) capped it, not the lock timeout (%s)", waited, lockTimeout)
		}
	})
}

// The middleware refuses, with a TxStore, the options this mode cannot
// honour, naming each; and the package doc names each as refused (it named
// FailOpen only).
func TestMiddleware_refuses_the_options_the_mode_cannot_honour(t *testing.T) {
	t.Parallel()
	db := openSQLite(t)
	txs, err := txinbox.New(txinbox.Config{DB: db, Dialect: sqlstore.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	refused := map[string]inboxmw.Config{
		"FailOpen":    {FailOpen: true},
		"PayloadHash": {PayloadHash: inboxmw.PayloadHashWarn},
		"MaxAttempts": {MaxAttempts: 3},
	}
	text := packageDoc(t)
	for field, cfg := range refused {
		cfg.Store, cfg.Bus, cfg.Group = txs, "test", "group"
		if _, err := inboxmw.New(cfg); !errors.Is(err, inboxmw.ErrInvalidConfig) || !strings.Contains(err.Error(), field) {
			t.Errorf("inboxmw.New with a TxStore and %s: %v, want an invalid config naming it", field, err)
		}
		if !regexp.MustCompile(`[^.]*\b` + field + `\b[^.]*\brefused\b`).MatchString(text) {
			t.Errorf("the package doc does not say that the middleware's %s is refused in this mode", field)
		}
	}
}
