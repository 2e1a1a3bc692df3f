package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
)

// DefaultLockTimeout is how long a duplicate waits for another consumer's
// uncommitted claim when [TxConfig.LockTimeout] is zero.
const DefaultLockTimeout = 10 * time.Second

// ErrMessagesReturned is returned (wrapped) by the transactional middleware
// when a handler returns messages and [TxConfig.Outbox] is nil. The
// transaction is rolled back, so nothing is marked and nothing of the
// handler's writes is kept: see [TxConfig.Outbox].
var ErrMessagesReturned = errors.New("inbox sql tx middleware: the handler returned messages, and TxConfig.Outbox is nil")

// OutboxFunc stores the messages a handler returned in the handler's own
// transaction tx, before it commits. ctx is the message's context.
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

// TxConfig configures [NewTxMiddleware].
type TxConfig struct {
	// DB is the database holding both the inbox table and the handler's own
	// data. Required. Each message in flight holds one of its connections
	// from the claim to the commit; size the pool for the router's
	// concurrency.
	DB *sql.DB

	// Dialect is DB's database. Required.
	Dialect Dialect

	// Table is the inbox table. Optional; default [DefaultTable]. It may be
	// the table of a lease [Store]; the two modes should not serve the same
	// keys (see the package documentation).
	Table string

	// Bus names the message bus in keys, e.g. "rabbit". Required.
	Bus string

	// Group names the consumer group or queue in keys. Required.
	Group string

	// Alias gives the key's alias segment, the message type. Optional;
	// default [keying.AliasFromHandler]: the router handler's name.
	Alias keying.AliasFunc

	// IDSources are tried in order for the message's id. Optional; default
	// [keying.DefaultIDSources]: the IdempotencyKey metadata field, then the
	// message UUID. A message for which none yields an id is handled as
	// MissingKey says.
	IDSources []keying.IDSource

	// MissingKey says what happens to a message without an id, as in the
	// main middleware. Optional; default [inboxmw.MissingKeyProcess]: the
	// handler runs in a transaction of its own (so TxFromContext works) with
	// no claim and no mark, logged and counted as no_key.
	// [inboxmw.MissingKeyReject] returns an error wrapping
	// [inbox.ErrNoKey] without running it, for a poison queue.
	MissingKey inboxmw.MissingKeyPolicy

	// Metrics counts outcomes (processed, duplicate, busy, released, no_key,
	// store_error) per handler and times the claims, as the main middleware
	// does. Optional; default none.
	Metrics inboxmw.Metrics

	// Retention is how long a processed key stays processed. Optional;
	// default inbox.DefaultRetention (7 days).
	Retention time.Duration

	// LockTimeout bounds how long a delivery waits for the row of another
	// delivery of the same key whose transaction has not ended; then the
	// middleware returns an error wrapping [inbox.ErrBusy] and the broker
	// redelivers later. On PostgreSQL it is the transaction's lock_timeout,
	// which also bounds the lock waits of the handler's own statements; on
	// MySQL and MariaDB, innodb_lock_wait_timeout, in whole seconds (rounded
	// up), set for the claim and reset after; on SQLite it bounds the wait
	// for the database's one writer connection. Optional; default
	// [DefaultLockTimeout].
	LockTimeout time.Duration

	// Outbox stores the messages a handler returns in the handler's
	// transaction, so that they commit with its writes and the key's mark;
	// the router then gets no message to publish. Optional; when nil, a
	// handler that returns messages has its transaction rolled back and the
	// middleware returns an error wrapping [ErrMessagesReturned]. Messages
	// are never handed to the router after the commit: if its publish failed,
	// the redelivered message would be a duplicate, acked without running the
	// handler, and the messages would be lost.
	Outbox OutboxFunc

	// Owner names this consumer in the inbox rows. Optional; default
	// "hostname/pid".
	Owner string

	// Logger receives the middleware's logs. Optional; default
	// watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c *TxConfig) setDefaults() {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.Retention == 0 {
		c.Retention = inbox.DefaultRetention
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = DefaultLockTimeout
	}
	if c.Alias == nil {
		c.Alias = keying.AliasFromHandler()
	}
	if len(c.IDSources) == 0 {
		c.IDSources = keying.DefaultIDSources()
	}
	if c.Owner == "" {
		c.Owner = inboxmw.DefaultOwner()
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	if c.Metrics == nil {
		c.Metrics = inboxmw.NopMetrics{}
	}
}

// Validate reports whether c is usable after defaults. Errors wrap
// [inbox.ErrInvalidArgument].
func (c TxConfig) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: inbox sql tx middleware: "+format, append([]any{inbox.ErrInvalidArgument}, args...)...))
	}
	if c.DB == nil {
		bad("DB is required")
	}
	if err := c.Dialect.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := ValidateTable(c.Table); err != nil {
		errs = append(errs, err)
	}
	if c.Bus == "" {
		bad("Bus is required")
	}
	if c.Group == "" {
		bad("Group is required")
	}
	if c.Bus != "" && c.Group != "" {
		kb := keying.Builder{Bus: c.Bus, Group: c.Group, Alias: c.Alias, IDSources: c.IDSources}
		if err := kb.Validate(); err != nil {
			bad("%v", err)
		}
	}
	if c.Retention < time.Millisecond {
		bad("Retention %s is below 1ms", c.Retention)
	}
	if c.LockTimeout < time.Millisecond {
		bad("LockTimeout %s is below 1ms", c.LockTimeout)
	}
	if err := (inbox.BeginOptions{Owner: c.Owner}).Validate(); err != nil {
		bad("Owner: %v", err)
	}
	if c.MissingKey != inboxmw.MissingKeyProcess && c.MissingKey != inboxmw.MissingKeyReject {
		bad("MissingKey %d is not a inboxmw.MissingKeyPolicy", c.MissingKey)
	}
	return errors.Join(errs...)
}

// TxInbox is the transactional inbox middleware: the claim of a message's
// key, the handler and the mark run in one database transaction, so the
// handler's writes and the mark commit together or not at all. Build it
// with [NewTxMiddleware] and add [TxInbox.Middleware] to a router.
type TxInbox struct {
	cfg  TxConfig
	keys keying.Builder
	q    txQueries
}

type txQueries struct {
	claim   string // claim(key, owner, retentionUS): inserts the processed row, or nothing on conflict
	inspect string // inspect(key): state, lease_until, expires_at, now, locking the row
	remove  string // remove(key): deletes an expired or abandoned row before a new claim
}

// NewTxMiddleware returns the transactional inbox middleware. The table must
// exist (see [Store.Migrate] and [DDL]).
func NewTxMiddleware(cfg TxConfig) (*TxInbox, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := quoteIdent(cfg.Dialect, cfg.Table).table
	var q txQueries
	switch cfg.Dialect {
	case Postgres:
		q = txQueries{
			claim: `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
INSERT INTO ` + t + ` (` + cols + `)
SELECT $1, 1, '', $2, NULL, 1, n.now, n.now, n.now, '', n.now + $3::bigint * interval '1 microsecond' FROM n
ON CONFLICT (msg_key) DO NOTHING`,
			inspect: `SELECT state, lease_until, expires_at, clock_timestamp() FROM ` + t + ` WHERE msg_key = $1 FOR UPDATE`,
			remove:  `DELETE FROM ` + t + ` WHERE msg_key = $1`,
		}
	case MySQL:
		const now = `UTC_TIMESTAMP(6)`
		q = txQueries{
			claim: `INSERT IGNORE INTO ` + t + ` (` + cols + `)
VALUES (?, 1, '', ?, NULL, 1, ` + now + `, ` + now + `, ` + now + `, '', ` + now + ` + INTERVAL ? MICROSECOND)`,
			// A shared lock: INSERT IGNORE took one on the duplicate row, and
			// asking for an exclusive one from every waiting duplicate would
			// deadlock them.
			inspect: `SELECT state, lease_until, expires_at, ` + now + ` FROM ` + t + ` WHERE msg_key = ? LOCK IN SHARE MODE`,
			remove:  `DELETE FROM ` + t + ` WHERE msg_key = ?`,
		}
	case SQLite:
		q = txQueries{
			claim: `INSERT INTO ` + t + ` (` + cols + `)
VALUES (?1, 1, '', ?2, NULL, 1, ` + liteNow + `, ` + liteNow + `, ` + liteNow + `, '', ` + liteNow + ` + ?3)
ON CONFLICT (msg_key) DO NOTHING`,
			inspect: `SELECT state, lease_until, expires_at, ` + liteNow + ` FROM ` + t + ` WHERE msg_key = ?1`,
			remove:  `DELETE FROM ` + t + ` WHERE msg_key = ?1`,
		}
	}
	keys := keying.Builder{Bus: cfg.Bus, Group: cfg.Group, Alias: cfg.Alias, IDSources: cfg.IDSources}
	return &TxInbox{cfg: cfg, keys: keys, q: q}, nil
}

type txCtxKey struct{}

// TxFromContext returns the transaction the transactional middleware runs
// the handler in. Handlers write through it (tx.ExecContext(msg.Context(),
// ...)) so their writes commit with the key's mark. It must not be
// committed or rolled back by the handler.
func TxFromContext(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := ctx.Value(txCtxKey{}).(*sql.Tx)
	return tx, ok
}

// Middleware is the [message.HandlerMiddleware].
//
// For each message it builds the key with [keying.Builder]
// (bus:group:alias:id, by default the IdempotencyKey metadata field or else
// the message UUID), takes a connection, begins a transaction and inserts
// the key's row, already marked processed. A concurrent delivery of the same
// key waits on that uncommitted row: when the first transaction commits it sees the key
// processed and acks without running the handler; when it rolls back it
// claims the key itself; after [TxConfig.LockTimeout] it returns an error
// wrapping [inbox.ErrBusy]. The handler runs with the transaction in its
// message context ([TxFromContext]). An error or a panic rolls everything
// back (the panic is re-raised); success commits the handler's writes, the
// messages it returned (through [TxConfig.Outbox]) and the mark at once.
func (m *TxInbox) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return m.handle(h, msg)
	}
}

func (m *TxInbox) handle(h message.HandlerFunc, msg *message.Message) (out []*message.Message, err error) {
	ctx := msg.Context()
	handler := message.HandlerNameFromCtx(ctx)
	key, _, err := m.keys.KeyString(msg)
	if err != nil {
		return m.keyError(h, msg, handler, err)
	}
	fields := watermill.LogFields{"message_uuid": msg.UUID, "handler_name": handler, "inbox_key": key}

	start := time.Now()
	tx, release, err := m.claim(ctx, key)
	m.cfg.Metrics.StoreCall(inboxmw.OpTryBegin, time.Since(start), err)
	if err != nil {
		switch {
		case errors.Is(err, inbox.ErrBusy):
			m.cfg.Metrics.Outcome(handler, inboxmw.OutcomeBusy)
		case ctx.Err() == nil:
			m.cfg.Metrics.Outcome(handler, inboxmw.OutcomeStoreError)
		}
		return nil, err
	}
	defer release()
	if tx == nil {
		m.cfg.Metrics.Outcome(handler, inboxmw.OutcomeDuplicate)
		m.cfg.Logger.Debug("inbox sql tx middleware: duplicate, acked without running the handler", fields)
		return nil, nil
	}
	return m.runInTx(h, msg, handler, tx, true, fields)
}

// keyError handles a message whose key cannot be built, by MissingKey.
func (m *TxInbox) keyError(h message.HandlerFunc, msg *message.Message, handler string, err error) ([]*message.Message, error) {
	err = fmt.Errorf("inbox sql tx middleware: key of message %q: %w", msg.UUID, err)
	fields := watermill.LogFields{"message_uuid": msg.UUID, "handler_name": handler}
	if !errors.Is(err, inbox.ErrNoKey) {
		m.cfg.Logger.Error("inbox sql tx middleware: cannot build the inbox key; message nacked", err, fields)
		return nil, err
	}
	m.cfg.Metrics.Outcome(handler, inboxmw.OutcomeNoKey)
	if m.cfg.MissingKey == inboxmw.MissingKeyReject {
		m.cfg.Logger.Error("inbox sql tx middleware: message has no idempotency key; rejected (MissingKeyReject)", err, fields)
		return nil, err
	}
	m.cfg.Logger.Info("inbox sql tx middleware: message has no idempotency key; processing it without deduplication", fields)
	tx, err := m.cfg.DB.BeginTx(msg.Context(), nil)
	if err != nil {
		return nil, wrapErr(msg.Context(), m.cfg.Dialect, m.cfg.Table, "begin", err)
	}
	return m.runInTx(h, msg, handler, tx, false, fields)
}

// runInTx runs the handler with tx in its context and commits or rolls back.
// claimed says whether tx holds the key's claim (false for a message without
// a key): only then are processed and released counted.
func (m *TxInbox) runInTx(h message.HandlerFunc, msg *message.Message, handler string, tx *sql.Tx, claimed bool, fields watermill.LogFields) (out []*message.Message, err error) {
	ctx := msg.Context()
	outcome := func(o inboxmw.Outcome) {
		if claimed || o == inboxmw.OutcomeStoreError {
			m.cfg.Metrics.Outcome(handler, o)
		}
	}
	done := false
	defer func() {
		if !done {
			_ = tx.Rollback() // a panic: roll back, let it go on
			outcome(inboxmw.OutcomeReleased)
		}
	}()
	msg.SetContext(context.WithValue(ctx, txCtxKey{}, tx))
	out, err = h(msg)
	msg.SetContext(ctx)
	if err != nil {
		done = true
		_ = tx.Rollback()
		outcome(inboxmw.OutcomeReleased)
		return nil, err
	}
	if len(out) > 0 {
		if m.cfg.Outbox == nil {
			done = true
			_ = tx.Rollback()
			outcome(inboxmw.OutcomeReleased)
			return nil, fmt.Errorf("%w: %d message(s) from the handler of message %q; its transaction was rolled back", ErrMessagesReturned, len(out), msg.UUID)
		}
		if err := m.cfg.Outbox(ctx, tx, out); err != nil {
			done = true
			_ = tx.Rollback()
			outcome(inboxmw.OutcomeReleased)
			return nil, fmt.Errorf("inbox sql tx middleware: storing %d returned message(s) in the outbox: %w", len(out), err)
		}
	}
	done = true
	start := time.Now()
	err = tx.Commit()
	m.cfg.Metrics.StoreCall(inboxmw.OpComplete, time.Since(start), err)
	if err != nil {
		outcome(inboxmw.OutcomeStoreError)
		return nil, wrapErr(ctx, m.cfg.Dialect, m.cfg.Table, "commit", err)
	}
	outcome(inboxmw.OutcomeProcessed)
	m.cfg.Logger.Trace("inbox sql tx middleware: committed", fields)
	return nil, nil
}

// claim begins the message's transaction and claims key in it. It returns a
// nil tx when the key was processed already (the transaction is over then).
// release gives the connection back; call it after the transaction ended.
func (m *TxInbox) claim(ctx context.Context, key string) (tx *sql.Tx, release func(), err error) {
	const attempts = 5
	for i := 0; ; i++ {
		tx, release, err = m.tryClaim(ctx, key)
		if err == nil || i == attempts-1 || classify(err) != kindRetry {
			return tx, release, err
		}
		// MySQL broke a deadlock between waiting duplicates by rolling one
		// back: nothing ran yet, claim again.
	}
}

func (m *TxInbox) tryClaim(ctx context.Context, key string) (*sql.Tx, func(), error) {
	d := m.cfg.Dialect
	fail := func(op string, err error) error {
		switch {
		case ctx.Err() != nil:
		case classify(err) == kindLockWait:
			return &inbox.BusyError{Key: key}
		}
		return wrapErr(ctx, d, m.cfg.Table, op, err)
	}

	// A bounded wait for a connection: on SQLite, whose pool has the one
	// writer connection, this is the wait for the other deliveries.
	connCtx, cancel := context.WithTimeout(ctx, m.cfg.LockTimeout)
	conn, err := m.cfg.DB.Conn(connCtx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) && d == SQLite {
			return nil, nil, &inbox.BusyError{Key: key}
		}
		return nil, nil, fail("taking a connection", err)
	}
	release := func() { _ = conn.Close() }

	if d == MySQL {
		secs := int64((m.cfg.LockTimeout + time.Second - 1) / time.Second)
		if _, err := conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = "+strconv.FormatInt(secs, 10)); err != nil {
			release()
			return nil, nil, fail("setting innodb_lock_wait_timeout", err)
		}
		release = func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, err := conn.ExecContext(rctx, "SET SESSION innodb_lock_wait_timeout = DEFAULT"); err != nil {
				// Do not hand a connection with our timeout back to the pool.
				_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			}
			_ = conn.Close()
		}
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		release()
		return nil, nil, fail("begin", err)
	}
	abort := func(op string, err error) (*sql.Tx, func(), error) {
		_ = tx.Rollback()
		release()
		return nil, nil, fail(op, err)
	}
	if d == Postgres {
		ms := strconv.FormatInt(max(m.cfg.LockTimeout.Milliseconds(), 1), 10) + "ms"
		if _, err := tx.ExecContext(ctx, "SELECT set_config('lock_timeout', $1, true)", ms); err != nil {
			return abort("setting lock_timeout", err)
		}
	}
	ret := us(m.cfg.Retention)
	for range 2 {
		res, err := tx.ExecContext(ctx, m.q.claim, key, m.cfg.Owner, ret)
		if err != nil {
			return abort("claim", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return abort("claim", err)
		}
		if n == 1 {
			return tx, release, nil
		}
		// The key has a committed row (a concurrent claim that committed was
		// waited for): processed, expired, or a lease store's.
		var (
			state                 int
			until, expires, now   time.Time
			untilOK, expOK, nowOK bool
		)
		ts := func(t *time.Time, ok *bool) *timeScanner { return &timeScanner{d: d, t: t, valid: ok} }
		err = tx.QueryRowContext(ctx, m.q.inspect, key).Scan(&state, ts(&until, &untilOK), ts(&expires, &expOK), ts(&now, &nowOK))
		if errors.Is(err, sql.ErrNoRows) {
			continue // deleted since: claim again
		}
		if err != nil {
			return abort("reading the key's row", err)
		}
		switch {
		case !expires.After(now), state != stateProcessed && !(untilOK && until.After(now)):
			// Expired, or a released or abandoned lease: start afresh.
			if _, err := tx.ExecContext(ctx, m.q.remove, key); err != nil {
				return abort("removing the expired row", err)
			}
			continue
		case state == stateProcessed:
			_ = tx.Rollback()
			release()
			return nil, func() {}, nil
		default:
			// A live lease of the lease store on the same key.
			_ = tx.Rollback()
			release()
			return nil, nil, &inbox.BusyError{Key: key, RetryAfter: until.Sub(now)}
		}
	}
	return abort("claim", fmt.Errorf("the key's row kept changing"))
}
