package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/outage"
	"github.com/watermill-inbox/inbox/stores/sql/internal/dialect"
)

// classify says what an error of the store's database/sql driver means; the
// dialect packages that import the drivers register how to tell.
func classify(err error) dialect.Kind { return dialect.Classify(err) }

// deadlockBackoff spaces the retries of a deadlocked statement: 1 to 2 ms,
// doubling (outage.Backoff's table lists every retry loop of the library).
var deadlockBackoff = outage.Backoff{Min: 2 * time.Millisecond, Max: 256 * time.Millisecond}

// retryDeadlocks runs f again, a few times with a short jittered pause,
// when the database rolled it back to break a deadlock (MySQL's InnoDB does
// so for concurrent upserts of one key) or a serialization conflict.
func retryDeadlocks(ctx context.Context, f func() error) error {
	const attempts = 8
	for i := 0; ; i++ {
		err := f()
		if err == nil || i == attempts-1 || classify(err) != dialect.Retry {
			return err
		}
		t := time.NewTimer(deadlockBackoff.Pause(i))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// fault maps an error of the database met by a call of the layer
// ([driver.Driver]), which wraps it in turn (naming the store, the call and
// the key, and mapping contexts): what is specific to SQL is said here. A
// missing table says how to create it; a deadlock that outlived its
// retries and a lost connection say so; all wrap inbox.ErrStoreUnavailable.
// Other errors are returned as they are (the layer reports them as
// inbox.ErrStoreUnavailable). sql.ErrNoRows never reaches here.
func (d *sqlDriver) fault(err error) error {
	switch classify(err) {
	case dialect.NoTable:
		return fmt.Errorf("%w: table %s does not exist: run Store.Migrate, set Options.AutoMigrate (migrate=true in a URL) or apply sqlstore.DDL: %w",
			inbox.ErrStoreUnavailable, d.opts.Table, err)
	case dialect.NoColumn:
		return fmt.Errorf("%w: table %s lacks a column of this version of the store (a table of an earlier layout): run Store.Migrate, set Options.AutoMigrate (migrate=true in a URL) or apply sqlstore.DDL: %w",
			inbox.ErrStoreUnavailable, d.opts.Table, err)
	case dialect.Retry:
		return fmt.Errorf("%w: still deadlocked after retries: %w", inbox.ErrStoreUnavailable, err)
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) {
		return fmt.Errorf("%w: connection lost: %w", inbox.ErrStoreUnavailable, err)
	}
	return err
}

// wrap turns an error of the store's own methods (New, Migrate, Cleanup,
// BeginTxClaim), which the layer does not carry, into the store's error: a
// canceled context wraps context.Canceled, a missed deadline both
// context.DeadlineExceeded and inbox.ErrStoreUnavailable, and every other
// fault inbox.ErrStoreUnavailable (the driver's error stays in the chain for
// errors.As). sql.ErrNoRows never reaches here.
func (d *sqlDriver) wrap(ctx context.Context, op string, err error) error {
	return wrapErr(ctx, d.opts.Dialect, d.opts.Table, op, err)
}

func wrapErr(ctx context.Context, d Dialect, table, op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, inbox.ErrStoreUnavailable) || errors.Is(err, inbox.ErrBusy) {
		return err
	}
	ctxErr := ctx.Err()
	switch {
	case errors.Is(ctxErr, context.Canceled) || (ctxErr == nil && errors.Is(err, context.Canceled)):
		return fmt.Errorf("sql store (%s): %s: %w (driver: %v)", d, op, context.Canceled, err)
	case ctxErr != nil || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: sql store (%s): %s: %w (driver: %v)", inbox.ErrStoreUnavailable, d, op, context.DeadlineExceeded, err)
	}
	switch classify(err) {
	case dialect.NoTable:
		return fmt.Errorf("%w: sql store (%s): %s: table %s does not exist: run Store.Migrate, set Options.AutoMigrate (migrate=true in a URL) or apply sqlstore.DDL: %w",
			inbox.ErrStoreUnavailable, d, op, table, err)
	case dialect.Retry:
		return fmt.Errorf("%w: sql store (%s): %s: still deadlocked after retries: %w", inbox.ErrStoreUnavailable, d, op, err)
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) {
		return fmt.Errorf("%w: sql store (%s): %s: connection lost: %w", inbox.ErrStoreUnavailable, d, op, err)
	}
	return fmt.Errorf("%w: sql store (%s): %s: %w", inbox.ErrStoreUnavailable, d, op, err)
}

// timeScanner scans a time column of any dialect: PostgreSQL timestamptz
// (absolute), MySQL DATETIME(6) holding UTC (as time.Time with any loc=
// setting, or as text without parseTime=true), SQLite integer microseconds.
type timeScanner struct {
	d     Dialect
	t     *time.Time
	valid *bool
}

func (d *sqlDriver) timeDest(t *time.Time, valid *bool) *timeScanner {
	return &timeScanner{d: d.opts.Dialect, t: t, valid: valid}
}

func (ts *timeScanner) Scan(src any) error {
	*ts.valid = src != nil
	switch v := src.(type) {
	case nil:
		*ts.t = time.Time{}
	case time.Time:
		if ts.d == MySQL {
			// The column holds UTC wall-clock time; read the fields as
			// such whatever loc= the DSN set.
			y, mo, d := v.Date()
			h, mi, sec := v.Clock()
			v = time.Date(y, mo, d, h, mi, sec, v.Nanosecond(), time.UTC)
		}
		*ts.t = v.UTC()
	case int64:
		*ts.t = time.UnixMicro(v).UTC()
	case float64:
		*ts.t = time.UnixMicro(int64(v)).UTC()
	case []byte:
		return ts.parse(string(v))
	case string:
		return ts.parse(v)
	default:
		return fmt.Errorf("sql store: cannot read %T as a time", src)
	}
	return nil
}

func (ts *timeScanner) parse(v string) error {
	for _, layout := range []string{"2006-01-02 15:04:05.999999", "2006-01-02 15:04:05", time.RFC3339Nano} {
		if t, err := time.ParseInLocation(layout, v, time.UTC); err == nil {
			*ts.t = t.UTC()
			return nil
		}
	}
	return fmt.Errorf("sql store: cannot read %q as a time", v)
}
