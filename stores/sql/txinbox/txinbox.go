package txinbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	inboxmw "github.com/watermill-inbox/inbox/middleware"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
)

// DefaultLockTimeout is how long a duplicate waits for another consumer's
// uncommitted claim when [Config.LockTimeout] is zero.
const DefaultLockTimeout = 10 * time.Second

// ErrMessagesReturned is returned (wrapped) by Finish when a handler returned
// messages and [Config.Outbox] is nil. The transaction is rolled back, so
// nothing is marked and none of the handler's writes is kept: see
// [Config.Outbox].
var ErrMessagesReturned = errors.New("txinbox: the handler returned messages, and Config.Outbox is nil")

// OutboxFunc stores the messages a handler returned in the handler's own
// transaction tx, before it commits. ctx is the handler's context (the
// message's, with tx in it).
//
// With Watermill's SQL publisher (github.com/ThreeDotsLabs/watermill-sql),
// build a publisher on the transaction and publish to an outbox topic that a
// forwarder (watermill's components/forwarder) or a SQL subscriber relays to
// the broker:
//
//	Outbox: func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) error {
//		pub, err := wsql.NewPublisher(tx, wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, logger)
//		if err != nil {
//			return err
//		}
//		return pub.Publish("outbox", msgs...)
//	},
type OutboxFunc func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) error

// Config configures [New]. Keys, missing keys, logs and metrics are the
// middleware's ([inboxmw.Config]); this is the database's side.
type Config struct {
	// DB is the database holding both the inbox table and the handler's own
	// data. Required. Each message in flight holds one of its connections
	// from the claim to the commit; size the pool for the router's
	// concurrency. On SQLite, limit it to one connection
	// (db.SetMaxOpenConns(1)): see the package documentation.
	DB *sql.DB

	// Dialect is DB's database: sqlstore.Postgres, sqlstore.MySQL (MySQL 8
	// and MariaDB) or sqlstore.SQLite. Required.
	Dialect sqlstore.Dialect

	// Table is the inbox table, which must exist (see sqlstore.DDL and
	// sqlstore.Store.Migrate). Optional; default sqlstore.DefaultTable. It
	// may be the table of a lease store (sqlstore.Store); the two should not
	// serve the same keys (see the package documentation).
	Table string

	// Retention is how long a processed key stays processed. Optional;
	// default inbox.DefaultRetention (7 days).
	Retention time.Duration

	// LockTimeout bounds how long a delivery waits for the row of another
	// delivery of the same key whose transaction has not ended; then
	// BeginTx fails with an error wrapping [inbox.ErrBusy] and the broker
	// redelivers later. On PostgreSQL it is the transaction's lock_timeout,
	// which also bounds the lock waits of the handler's own statements; on
	// MySQL and MariaDB, innodb_lock_wait_timeout, in whole seconds (rounded
	// up), set for the transaction's connection and reset after. On every
	// database it also bounds the wait for a pooled connection (on SQLite,
	// the database's one writer connection). Optional; default
	// [DefaultLockTimeout].
	LockTimeout time.Duration

	// Outbox stores the messages a handler returns in the handler's
	// transaction, so that they commit with its writes and the key's mark;
	// the router then gets no message to publish. Optional; when nil, a
	// handler that returns messages has its transaction rolled back and gets
	// an error wrapping [ErrMessagesReturned]. Messages are never handed to
	// the router after the commit: if its publish failed, the redelivered
	// message would be a duplicate, acked without running the handler, and
	// the messages would be lost.
	Outbox OutboxFunc

	// Owner names this consumer in the inbox rows. Optional; default
	// inboxmw.DefaultOwner(): "hostname/pid".
	Owner string

	// CleanupInterval is how often the store's janitor deletes expired
	// rows, as sqlstore.Options.CleanupInterval: the janitor starts with
	// the store's first call and stops at Close. Optional; default
	// sqlstore.DefaultCleanupInterval of the Retention (a tenth of it, at
	// most an hour).
	CleanupInterval time.Duration

	// DisableCleanup turns the janitor off, as
	// sqlstore.Options.DisableCleanup: expired rows then stay until a
	// cleanup of your own (sqlstore.Store.Cleanup, `inboxctl cleanup`).
	// Optional; default false. It excludes a CleanupInterval.
	DisableCleanup bool

	// CleanupBatch bounds the rows one cleanup statement deletes. Optional;
	// default sqlstore.DefaultCleanupBatch.
	CleanupBatch int

	// Logger receives the janitor's errors and the passes that fall behind.
	// Optional; default no logging.
	Logger watermill.LoggerAdapter
}

func (c *Config) setDefaults() {
	if c.Table == "" {
		c.Table = sqlstore.DefaultTable
	}
	if c.Retention == 0 {
		c.Retention = inbox.DefaultRetention
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = DefaultLockTimeout
	}
	if c.Owner == "" {
		c.Owner = inboxmw.DefaultOwner()
	}
}

// Validate reports every problem of c (after defaults), joined, each
// wrapping [inbox.ErrInvalidArgument] and naming the field and its value.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: txinbox: "+format, append([]any{inbox.ErrInvalidArgument}, args...)...))
	}
	if c.DB == nil {
		bad("DB is required (nil)")
	}
	if err := c.Dialect.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("txinbox: Dialect: %w", err)) // names the value
	}
	if err := sqlstore.ValidateTable(c.Table); err != nil {
		errs = append(errs, fmt.Errorf("txinbox: Table: %w", err)) // names the value
	}
	if c.Retention < time.Millisecond {
		bad("Retention %s is below 1ms", c.Retention)
	}
	if c.CleanupInterval < 0 {
		bad("CleanupInterval %s is negative", c.CleanupInterval)
	}
	if c.DisableCleanup && c.CleanupInterval != 0 {
		bad("CleanupInterval %s with DisableCleanup: the janitor is either off or runs at an interval", c.CleanupInterval)
	}
	if c.CleanupBatch < 0 {
		bad("CleanupBatch %d is negative", c.CleanupBatch)
	}
	if c.LockTimeout < time.Millisecond {
		bad("LockTimeout %s is below 1ms", c.LockTimeout)
	}
	if err := (inbox.BeginOptions{Owner: c.Owner}).Validate(); err != nil {
		bad("Owner %.64q is not valid UTF-8 without NUL of at most %d bytes (it has %d)", c.Owner, inbox.MaxOwnerLen, len(c.Owner))
	}
	return errors.Join(errs...)
}

// Store is the transactional inbox store: an [inboxmw.TxStore] whose claim
// of a key is a database transaction that the handler writes through. Build
// it with [New] and give it to [inboxmw.New] as Config.Store. It is safe for
// concurrent use.
type Store struct {
	cfg  Config
	opts sqlstore.TxClaimOptions

	// st is the SQL store on the same table, made on first use (on MySQL,
	// sqlstore.New asks the server for its version): BeginTx claims through
	// it, IsProcessed and MarkProcessed are its.
	st     atomic.Pointer[sqlstore.Store]
	closed atomic.Bool
}

var (
	_ inboxmw.TxStore         = (*Store)(nil)
	_ inbox.RetentionReporter = (*Store)(nil)
)

// New returns the store for cfg. It does no I/O: the table must exist, and
// a missing one shows on the first claim as an error wrapping
// [inbox.ErrStoreUnavailable] that says to migrate.
func New(cfg Config) (*Store, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Store{cfg: cfg, opts: sqlstore.TxClaimOptions{Owner: cfg.Owner, LockTimeout: cfg.LockTimeout}}, nil
}

// store returns the SQL store on the table, making it on first use.
func (s *Store) store(ctx context.Context) (*sqlstore.Store, error) {
	if st := s.st.Load(); st != nil {
		return st, nil
	}
	if s.closed.Load() {
		return nil, fmt.Errorf("txinbox: %w", inbox.ErrClosed)
	}
	st, err := sqlstore.New(ctx, s.cfg.DB, sqlstore.Options{
		Dialect: s.cfg.Dialect, Table: s.cfg.Table, Retention: s.cfg.Retention,
		CleanupInterval: s.cfg.CleanupInterval, DisableCleanup: s.cfg.DisableCleanup, CleanupBatch: s.cfg.CleanupBatch,
		Logger: s.cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	if !s.st.CompareAndSwap(nil, st) {
		_ = st.Close() // a concurrent first call made one too
		st = s.st.Load()
	}
	if s.closed.Load() {
		_ = st.Close() // Close ran meanwhile and may not have seen it
	}
	return st, nil
}

// CleanupStats returns what the store's janitor did (see
// sqlstore.Store.CleanupStats): zeros before the store's first call.
func (s *Store) CleanupStats() sqlstore.CleanupStats {
	if st := s.st.Load(); st != nil {
		return st.CleanupStats()
	}
	return sqlstore.CleanupStats{}
}

// Retention implements [inbox.RetentionReporter]: [Config.Retention], after
// its default.
func (s *Store) Retention() time.Duration { return s.cfg.Retention }

// Close makes later calls fail with [inbox.ErrClosed] and frees the
// statements the store prepared (on SQLite). It does not close Config.DB,
// and does not end transactions in flight: their Finish still commits or
// rolls back.
func (s *Store) Close() error {
	s.closed.Store(true)
	if st := s.st.Load(); st != nil {
		return st.Close()
	}
	return nil
}

// IsProcessed implements [inbox.Store]: whether key's mark has committed.
func (s *Store) IsProcessed(ctx context.Context, key string) (bool, error) {
	st, err := s.store(ctx)
	if err != nil {
		return false, err
	}
	return st.IsProcessed(ctx, key)
}

// MarkProcessed implements [inbox.Store]: it marks key processed outside any
// handler's transaction (an operator's tool; the middleware never calls it
// on a TxStore).
func (s *Store) MarkProcessed(ctx context.Context, key string) error {
	st, err := s.store(ctx)
	if err != nil {
		return err
	}
	return st.MarkProcessed(ctx, key)
}

type txKey struct{}

// TxFromContext returns the transaction the handler runs in, from the
// message's context (msg.Context()) in a handler under the middleware.
// Handlers write through it (tx.ExecContext(msg.Context(), ...)) so that
// their writes commit with the key's mark. The handler must not commit or
// roll it back: the middleware does, after the handler.
func TxFromContext(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*sql.Tx)
	return tx, ok && tx != nil
}

// BeginTx implements [inboxmw.TxStore]: it takes a pooled connection, begins
// a transaction bound to ctx and claims key in it by inserting the key's row
// already marked processed, uncommitted (sqlstore.Store.BeginTxClaim). A key
// processed already gives [inbox.Processed]; a key claimed by a concurrent
// delivery is waited for, for at most [Config.LockTimeout], after which the
// error wraps [inbox.ErrBusy]; otherwise the claim is [inbox.Acquired], with
// the transaction in its Context ([TxFromContext]) and a Finish that
// commits the handler's writes, the returned messages (through
// [Config.Outbox]) and the mark at once, or rolls them all back. An empty
// key begins a transaction without a claim.
func (s *Store) BeginTx(ctx context.Context, key string) (inboxmw.TxClaim, error) {
	st, err := s.store(ctx)
	if err != nil {
		return inboxmw.TxClaim{}, err
	}
	tx, end, processed, err := st.BeginTxClaim(ctx, key, s.opts)
	if err != nil {
		return inboxmw.TxClaim{}, err
	}
	if processed {
		return inboxmw.TxClaim{Status: inbox.Processed}, nil
	}
	hctx := context.WithValue(ctx, txKey{}, tx)
	return inboxmw.TxClaim{Status: inbox.Acquired, Context: hctx, Finish: s.finish(hctx, key, tx, end)}, nil
}

func (s *Store) finish(ctx context.Context, key string, tx *sql.Tx, end func(commit bool) error) func([]*message.Message, error) error {
	var done atomic.Bool
	return func(out []*message.Message, handlerErr error) error {
		if done.Swap(true) {
			return fmt.Errorf("txinbox: Finish called again for key %q; the transaction had ended", key)
		}
		if handlerErr != nil {
			_ = end(false)
			return handlerErr
		}
		if len(out) > 0 {
			if s.cfg.Outbox == nil {
				_ = end(false)
				return fmt.Errorf("%w: %d message(s) from the handler of key %q; its transaction was rolled back", ErrMessagesReturned, len(out), key)
			}
			if err := s.cfg.Outbox(ctx, tx, out); err != nil {
				_ = end(false)
				return fmt.Errorf("txinbox: storing %d returned message(s) of key %q in the outbox failed; the transaction was rolled back: %w", len(out), key, err)
			}
		}
		return end(true)
	}
}
