package sqlstore_test

import (
	"database/sql"
	"net/url"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/faultproxy"
	"github.com/watermill-inbox/inbox/internal/testenv"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	"github.com/watermill-inbox/inbox/stores/sql/internal/sqltest"
	"github.com/watermill-inbox/inbox/stores/storetest"
)

func TestConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			table := newTable(t, db, b.dialect)
			precision := time.Microsecond
			if b.dialect == sqlstore.SQLite {
				precision = time.Millisecond // SQLite's clock
			}
			storetest.Run(t, storetest.Harness{
				New: func(t *testing.T, cfg storetest.Config) inbox.LeaseStore {
					return newStore(t, b, db, table, sqlstore.Options{Retention: cfg.Retention})
				},
				TimePrecision: precision,
				Faults:        faults(b, table),
			})
		})
	}
}

// faults gives the suite's fault cases a store on table over a pool of its
// own that reaches the server through a faultproxy; nil for SQLite, which
// has no link.
func faults(b backend, table string) func(t *testing.T, cfg storetest.Config) (inbox.LeaseStore, storetest.Link) {
	var env testenv.Service
	switch b.dialect {
	case sqlstore.Postgres:
		env = testenv.Postgres
	case sqlstore.MySQL:
		env = testenv.MySQL
	default:
		return nil
	}
	return func(t *testing.T, cfg storetest.Config) (inbox.LeaseStore, storetest.Link) {
		u, err := url.Parse(env.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		p := faultproxy.New(t, u.Host)
		u.Host = p.Addr()
		driver, dsn := "pgx", u.String()
		if b.dialect == sqlstore.MySQL {
			driver = "mysql"
			dsn = sqltest.MySQLDSN(t, u.String())
		}
		db, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(16) // the servers are shared
		t.Cleanup(func() { _ = db.Close() })
		return newStore(t, b, db, table, sqlstore.Options{Retention: cfg.Retention}), p
	}
}

func TestNew_detects_MariaDB_RETURNING(t *testing.T) {
	t.Parallel()
	db := openMySQL(t)
	b := backends[1]
	s := newStore(t, b, db, newTable(t, db, b.dialect), sqlstore.Options{})
	if !sqlstore.UsesReturning(s) {
		t.Fatal("the store does not use INSERT ... RETURNING on the MariaDB server under test")
	}
}
