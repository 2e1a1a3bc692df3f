package sqlstore_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	"github.com/watermill-inbox/inbox/stores/sql/internal/sqltest"
)

// sizingKeys is the number of keys the sizing test claims and completes.
const sizingKeys = 20000

// The bytes a processed key costs, against the floor: a table of the key
// (primary key) and its expiry (with its index) alone, filled the same way
// and measured the same way (PostgreSQL: pg_total_relation_size after
// VACUUM; MariaDB: data and index length after ANALYZE TABLE; SQLite: the
// file's pages after VACUUM). Keys of the shape rabbit:billing:orders:<uuid>,
// the payload hash on, claimed and completed through stores.Open, one key
// after the other (INBOX_TEST_SIZING_WORKERS=n: by n goroutines; the floor
// is filled the same way). The compact layout holds PostgreSQL and MariaDB
// to 1.35 times the floor. It takes seconds per database, so it runs only
// with INBOX_TEST_SIZING=1.
func TestSizing_processed_key_against_the_floor(t *testing.T) {
	if os.Getenv("INBOX_TEST_SIZING") == "" {
		t.Skip("set INBOX_TEST_SIZING=1 to measure the bytes per processed key")
	}
	for _, b := range []backend{backends[0], backends[1], backends[3]} {
		t.Run(b.name, func(t *testing.T) {
			var (
				raw string
				db  *sql.DB
			)
			switch b.dialect {
			case sqlstore.Postgres:
				raw, db = testenv.Postgres.URL(t), openPostgres(t)
			case sqlstore.MySQL:
				raw, db = testenv.MySQL.URL(t), openMySQL(t)
			default:
				path := sqltest.SQLiteFile(t)
				raw, db = "sqlite://"+path, sqltest.OpenSQLiteFile(t, path)
			}
			// Longer than ctxT's bound: one key after the other takes a while.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			keys := make([]string, sizingKeys)
			for i := range keys {
				var u [16]byte
				_, _ = rand.Read(u[:])
				keys[i] = fmt.Sprintf("rabbit:billing:orders:%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
			}

			table := newTable(t, db, b.dialect)
			st, err := stores.Open(ctx, withParams(raw, "table="+table))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			ls := st.(inbox.LeaseStore)
			parallel(t, keys, func(k string) error {
				sum := sha256.Sum256([]byte("payload of " + k))
				c, err := ls.TryBegin(ctx, k, inbox.BeginOptions{Owner: "consumer-host-7/12345", PayloadHash: hex.EncodeToString(sum[:])})
				if err != nil || c.Status != inbox.Acquired {
					return fmt.Errorf("TryBegin(%s): %+v, %v", k, c, err)
				}
				return ls.Complete(ctx, k, c.LeaseID)
			})
			got := tableBytes(t, db, b.dialect, table)

			floor := newTable(t, db, b.dialect)
			if _, err := db.ExecContext(ctx, "DROP TABLE "+floor); err != nil {
				t.Fatal(err)
			}
			var ddl []string
			insert := "INSERT INTO " + floor + " (k, e) VALUES (?, ?)"
			switch b.dialect {
			case sqlstore.Postgres:
				ddl = []string{`CREATE TABLE ` + floor + ` (k TEXT COLLATE "C" PRIMARY KEY, e TIMESTAMPTZ NOT NULL)`, `CREATE INDEX ON ` + floor + ` (e)`}
				insert = "INSERT INTO " + floor + " (k, e) VALUES ($1, clock_timestamp() + interval '7 days')"
			case sqlstore.MySQL:
				ddl = []string{`CREATE TABLE ` + floor + ` (k VARBINARY(1024) PRIMARY KEY, e BIGINT NOT NULL, INDEX (e)) ENGINE=InnoDB`}
			default:
				ddl = []string{`CREATE TABLE ` + floor + ` (k TEXT PRIMARY KEY, e INTEGER NOT NULL) WITHOUT ROWID`, `CREATE INDEX ` + floor + `_e ON ` + floor + ` (e)`}
			}
			for _, q := range ddl {
				if _, err := db.ExecContext(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			parallel(t, keys, func(k string) error {
				var err error
				if b.dialect == sqlstore.Postgres {
					_, err = db.ExecContext(ctx, insert, k)
				} else {
					// Rising, as the store's expiries are.
					_, err = db.ExecContext(ctx, insert, k, time.Now().Add(7*24*time.Hour).UnixMicro())
				}
				return err
			})
			floorBytes := tableBytes(t, db, b.dialect, floor)

			perKey, perFloor := float64(got)/sizingKeys, float64(floorBytes)/sizingKeys
			ratio := perKey / perFloor
			t.Logf("%s: %.0f bytes per processed key, floor %.0f, ratio %.2f", b.name, perKey, perFloor, ratio)
			if b.dialect != sqlstore.SQLite && ratio > 1.35 {
				t.Errorf("%s: %.0f bytes per processed key is %.2f times the floor's %.0f; want at most 1.35", b.name, perKey, ratio, perFloor)
			}
		})
	}
}

// parallel runs f on every key from INBOX_TEST_SIZING_WORKERS goroutines
// (default 1).
func parallel(t *testing.T, keys []string, f func(k string) error) {
	t.Helper()
	workers := 1
	if w := os.Getenv("INBOX_TEST_SIZING_WORKERS"); w != "" {
		n, err := strconv.Atoi(w)
		if err != nil || n < 1 {
			t.Fatalf("INBOX_TEST_SIZING_WORKERS=%q is not a positive number", w)
		}
		workers = n
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	next := make(chan string)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				if err := f(k); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for _, k := range keys {
		next <- k
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d errors, the first: %v", len(errs), errs[0])
	}
}

// tableBytes is the size of table with its indexes, measured as the
// sizing test says.
func tableBytes(t *testing.T, db *sql.DB, d sqlstore.Dialect, table string) int64 {
	t.Helper()
	ctx := ctxT(t)
	var n int64
	var err error
	switch d {
	case sqlstore.Postgres:
		if _, err = db.ExecContext(ctx, "VACUUM "+table); err == nil {
			err = db.QueryRowContext(ctx, "SELECT pg_total_relation_size($1)", table).Scan(&n)
			var heap, idx int64
			_ = db.QueryRowContext(ctx, "SELECT pg_relation_size($1), pg_indexes_size($1)", table).Scan(&heap, &idx)
			t.Logf("%s: heap %d, indexes %d bytes", table, heap, idx)
		}
	case sqlstore.MySQL:
		if _, err = db.ExecContext(ctx, "ANALYZE TABLE "+table); err == nil {
			err = db.QueryRowContext(ctx, "SELECT data_length + index_length FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?", table).Scan(&n)
		}
	default:
		// The table's and its index's pages (dbstat), after VACUUM.
		if _, err = db.ExecContext(ctx, "VACUUM"); err == nil {
			err = db.QueryRowContext(ctx, "SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name = ? OR name IN (SELECT name FROM sqlite_master WHERE tbl_name = ? AND type = 'index')", table, table).Scan(&n)
		}
	}
	if err != nil {
		t.Fatalf("measuring %s: %v", table, err)
	}
	return n
}
