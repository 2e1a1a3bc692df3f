package sqlstore_test

import (
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
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
			})
		})
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
