package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/sql/internal/dialect"
)

// The dialects' packages register their URL schemes with package stores;
// their openers open the store here.
func init() { dialect.OpenURL = openURL }

// storeParams are the parameters every SQL URL takes besides the shared
// retention and lease.
var storeParams = []string{"table", "migrate", "cleanup", "cleanup_interval", "cleanup_batch", "max_conns"}

type urlOptions struct {
	opts     Options
	maxConns int
	lazy     bool // check=false: no check at Open
}

func popStoreParams(q url.Values, p stores.Params, d Dialect) (urlOptions, error) {
	o := urlOptions{opts: Options{Dialect: d, Retention: p.Retention, Lease: p.Lease}, lazy: p.Lazy}
	if v, ok, err := stores.PopString(q, "table"); err != nil {
		return o, err
	} else if ok {
		if err := ValidateTable(v); err != nil {
			return o, fmt.Errorf("%w: parameter table: %v", stores.ErrInvalidURL, err)
		}
		o.opts.Table = v
	}
	if v, ok, err := stores.PopString(q, "migrate"); err != nil {
		return o, err
	} else if ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return o, fmt.Errorf("%w: parameter migrate=%q is not true or false", stores.ErrInvalidURL, v)
		}
		o.opts.AutoMigrate = b
		if b && p.Lazy && d != SQLite {
			return o, fmt.Errorf("%w: parameters migrate=true and check=false exclude each other: creating the table needs the database server at Open; migrate once (migrate=true, Store.Migrate or sqlstore.DDL), then open with check=false", stores.ErrInvalidURL)
		}
	}
	d2, err := stores.PopDuration(q, "cleanup_interval")
	if err != nil {
		return o, err
	}
	o.opts.CleanupInterval = d2
	if v, ok, err := stores.PopString(q, "cleanup"); err != nil {
		return o, err
	} else if ok {
		switch v {
		case "on":
		case "off":
			if d2 != 0 {
				return o, fmt.Errorf("%w: parameters cleanup=off and cleanup_interval=%s exclude each other: the janitor is either off or runs at an interval", stores.ErrInvalidURL, d2)
			}
			o.opts.DisableCleanup = true
		default:
			return o, fmt.Errorf("%w: parameter cleanup=%q is not on or off", stores.ErrInvalidURL, v)
		}
	}
	for name, dst := range map[string]*int{"cleanup_batch": &o.opts.CleanupBatch, "max_conns": &o.maxConns} {
		if v, ok, err := stores.PopString(q, name); err != nil {
			return o, err
		} else if ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return o, fmt.Errorf("%w: parameter %s=%q is not a positive integer", stores.ErrInvalidURL, name, v)
			}
			*dst = n
		}
	}
	return o, nil
}

// openURL opens the store a URL of one of drv's schemes names: it reads
// the store's parameters, rejects those that are neither the store's nor
// the driver's, and has the driver open the database, which openDB then
// checks.
func openURL(ctx context.Context, u *url.URL, p stores.Params, drv *dialect.Driver) (stores.Store, error) {
	d := Dialect(drv.Dialect)
	q := u.Query()
	o, err := popStoreParams(q, p, d)
	if err != nil {
		return nil, err
	}
	own := url.Values{}
	for _, name := range drv.Params {
		if vs, ok := q[name]; ok {
			own[name] = vs
			delete(q, name)
		}
	}
	if err := stores.RejectUnknown(u.Scheme, q, append(append([]string{}, storeParams...), drv.Params...)...); err != nil {
		return nil, err
	}
	c := *u
	c.RawQuery = own.Encode()
	db, t, err := drv.Connect(&c)
	if err != nil {
		return nil, err
	}
	if d == SQLite {
		if t.Database == ":memory:" {
			// Each connection would have its own empty database: keep one,
			// and create the table, since nothing else can.
			o.maxConns = 1
			db.SetConnMaxLifetime(0)
			db.SetConnMaxIdleTime(0)
			o.opts.AutoMigrate = true
		} else if o.maxConns == 0 {
			o.maxConns = 1 // one writer at a time: queue in the pool, not in SQLite's busy loop
		}
	}
	return openDB(ctx, db, o, t)
}

// openDB makes the store of a URL over db, which it owns. Unless o.lazy
// (check=false), it checks the store works: it connects (authenticating),
// then New runs (asking a MySQL-protocol server its version, creating the
// table with migrate=true), then it reads one key through the store's Get
// statement, which checks the table and the user's rights on it. With
// o.lazy it sends nothing: New runs now on PostgreSQL and SQLite, where it
// needs no server without migrate=true; on MySQL the store asks the server
// its version at its first call.
func openDB(ctx context.Context, db *sql.DB, o urlOptions, t dialect.Target) (stores.Store, error) {
	if o.maxConns > 0 {
		db.SetMaxOpenConns(o.maxConns)
	}
	if o.opts.Table == "" {
		o.opts.Table = DefaultTable
	}
	fail := func(step string, err error) (stores.Store, error) {
		_ = db.Close()
		return nil, openError(ctx, t, o.opts.Table, "Open", step, err)
	}
	if o.lazy && o.opts.Dialect == MySQL {
		// New would ask the server its version: the store asks at its
		// first call instead.
		opts := o.opts
		opts.setDefaults()
		if err := opts.Validate(); err != nil {
			_ = db.Close()
			return nil, err
		}
		s, err := newStore(db, opts)
		if err != nil {
			_ = db.Close()
			return nil, err
		}
		s.d.ownsDB = true
		if !opts.DisableCleanup {
			s.d.startJanitor()
		}
		return s, nil
	}
	if !o.lazy {
		if err := db.PingContext(ctx); err != nil {
			return fail("connecting", err)
		}
	}
	s, err := New(ctx, db, o.opts)
	if err != nil {
		if errors.Is(err, inbox.ErrInvalidArgument) {
			_ = db.Close()
			return nil, err
		}
		return fail("asking the server version or migrating", err)
	}
	s.d.ownsDB = true
	if !o.lazy {
		if err := checkTable(ctx, s, t); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	return s, nil
}
