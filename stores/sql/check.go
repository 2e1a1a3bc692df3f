package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/sql/internal/dialect"
)

// checkKey is the key the check at Open reads (never writes).
const checkKey = "stores.Open check"

// checkTable reads one key through the store's own Get statement, so that
// the table, its columns and the user's right to read it are checked
// without writing anything.
func checkTable(ctx context.Context, s *Store, t dialect.Target) error {
	if _, err := s.Get(ctx, checkKey); err != nil {
		if classify(err) == dialect.NoColumn {
			if earlier, lerr := s.d.earlierTable(ctx); lerr == nil && earlier {
				return stores.Misconfigured(fmt.Sprintf("sql store (%s): table %s in %s has the layout of an earlier version of the store (with the column lease_id), "+
					"which this version does not read: migrate it (migrate=true in the URL, inboxctl migrate, or Store.Migrate copy its rows to the compact layout, "+
					"in place; on MySQL and MariaDB stop the consumers of the earlier version first)",
					t.Dialect, s.Table(), t), rootCause(err))
			}
		}
		return openError(ctx, t, s.Table(), "Open", "reading table "+s.Table(), err)
	}
	return nil
}

// openError turns an error met while opening (connecting, asking the
// version, migrating, reading the table) into the error of Open: a mistake
// of configuration wraps stores.ErrMisconfigured and
// inbox.ErrStoreUnavailable and says how to fix it; anything else wraps
// inbox.ErrStoreUnavailable (the store's usual wrapping). Drivers' messages
// quote no password.
//
// at is "Open", or the call that met err on a store opened with check=false.
func openError(ctx context.Context, t dialect.Target, table, at, step string, err error) error {
	d := Dialect(t.Dialect)
	if drv := dialect.Lookup(t.Dialect); drv != nil {
		if msg := drv.Misconfiguration(t, table, err); msg != "" {
			return stores.Misconfigured(fmt.Sprintf("sql store (%s): %s", d, msg), rootCause(err))
		}
	}
	op := at + ": " + step + ", " + t.String()
	if errors.Is(ctx.Err(), context.Canceled) {
		return wrapErr(ctx, d, table, op, err)
	}
	var nerr net.Error
	if ctx.Err() != nil || errors.As(err, &nerr) {
		hint := ""
		if at == "Open" {
			hint = "; is the server up and the address right? check=false in the URL opens without this check"
		}
		return fmt.Errorf("%w: sql store (%s): %s: cannot reach %s: %w%s",
			inbox.ErrStoreUnavailable, d, at, t, rootCause(err), hint)
	}
	return wrapErr(ctx, d, table, op, err)
}

// rootCause strips the store's own wrapping (wrapErr's), keeping the
// driver's error.
func rootCause(err error) error {
	if c := dialect.Cause(err); c != nil {
		return c
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return op
	}
	return err
}
