package sqlstore_test

import (
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	"github.com/watermill-inbox/inbox/stores/sql/internal/sqltest"
)

// List takes the prefix as a range of keys, byte for byte: % and _ are
// no patterns, case and trailing spaces count, and runes at the edges of
// UTF-8 bound the range right.
func TestList_prefix_is_a_range_of_keys(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			s := newStore(t, b, db, newTable(t, db, b.dialect), sqlstore.Options{})
			keys := []string{
				"p%_", "p%_x", "p%_\U0010FFFF", "p%`", "p%a", "p%", "pa_", "pab", "P%_x", "p%_ ",
				"q\uD7FF", "q\uD7FFz", "q\uE000", "q\U0010FFFF", "q\U0010FFFFz", "r", "q",
			}
			for _, k := range keys {
				if err := s.MarkProcessed(ctxT(t), k); err != nil {
					t.Fatal(err)
				}
			}
			for prefix, want := range map[string][]string{
				"p%_":         {"p%_", "p%_ ", "p%_x", "p%_\U0010FFFF"},
				"p%":          {"p%", "p%_", "p%_ ", "p%_x", "p%_\U0010FFFF", "p%`", "p%a"},
				"q\uD7FF":     {"q\uD7FF", "q\uD7FFz"},
				"q\U0010FFFF": {"q\U0010FFFF", "q\U0010FFFFz"},
				"q":           {"q", "q\uD7FF", "q\uD7FFz", "q\uE000", "q\U0010FFFF", "q\U0010FFFFz"},
				"P":           {"P%_x"},
				"":            nil, // every key, checked below
			} {
				for _, limit := range []int{1, 2, 1000} {
					got := listKeys(t, s, inbox.ListOptions{Prefix: prefix, Limit: limit})
					if prefix == "" {
						want = slices.Clone(keys)
						slices.Sort(want)
					}
					if !slices.Equal(got, want) {
						t.Errorf("List(prefix %q, limit %d) = %q, want %q", prefix, limit, got, want)
					}
				}
			}
		})
	}
}

// listKeys pages through List and returns the keys.
func listKeys(t *testing.T, a inbox.Admin, opts inbox.ListOptions) []string {
	t.Helper()
	var keys []string
	for range 100 {
		p, err := a.List(ctxT(t), opts)
		if err != nil {
			t.Fatalf("List(%+v): %v", opts, err)
		}
		if len(p.Items) == 0 && p.Next != "" {
			t.Fatalf("List(%+v): an empty page with a cursor", opts)
		}
		for _, it := range p.Items {
			keys = append(keys, it.Key)
		}
		if p.Next == "" {
			return keys
		}
		opts.Cursor = p.Next
	}
	t.Fatalf("List(%+v): more than 100 pages", opts)
	return nil
}

// A page is one statement that reads one row more than the limit: a full
// last page says there is no next one.
func TestList_full_last_page_has_no_cursor(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			s := newStore(t, b, db, newTable(t, db, b.dialect), sqlstore.Options{})
			for _, k := range []string{"a", "b", "c", "d"} {
				if err := s.MarkProcessed(ctxT(t), k); err != nil {
					t.Fatal(err)
				}
			}
			p, err := s.List(ctxT(t), inbox.ListOptions{Limit: 2})
			if err != nil || len(p.Items) != 2 || p.Next != "b" {
				t.Fatalf("first page %+v, %v; want a, b and a cursor", p, err)
			}
			p, err = s.List(ctxT(t), inbox.ListOptions{Limit: 2, Cursor: p.Next})
			if err != nil || len(p.Items) != 2 || p.Items[1].Key != "d" || p.Next != "" {
				t.Fatalf("last page %+v, %v; want c, d and no cursor", p, err)
			}
		})
	}
}

// A table of the earlier layout (without reason, as the
// previous version of the store made it) is reported at Open, with the
// fix; Migrate (migrate=true) adds the column, keeps the rows, and runs
// again as a no-op.
func TestOpen_earlier_layout_is_migrated(t *testing.T) {
	for _, b := range []backend{backends[0], backends[1], backends[3]} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
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
			table := newTable(t, db, b.dialect)
			if _, err := db.ExecContext(ctxT(t), "ALTER TABLE "+table+" DROP COLUMN reason"); err != nil {
				t.Fatalf("dropping reason from %s: %v", table, err)
			}
			insertProcessed(t, db, b.dialect, table, []string{"earlier:processed"}, time.Now().Add(time.Hour))
			raw = withParams(raw, "table="+table)

			_, err := stores.Open(ctxT(t), raw)
			if !errors.Is(err, stores.ErrMisconfigured) || !strings.Contains(err.Error(), "layout of an earlier version") || !strings.Contains(err.Error(), "migrate=true") {
				t.Fatalf("Open of a table of the earlier layout: %v; want ErrMisconfigured naming the earlier layout and the fix", err)
			}
			t.Logf("Open: %v", err)
			for range 2 { // the second is a no-op
				st, err := stores.Open(ctxT(t), withParams(raw, "migrate=true"))
				if err != nil {
					t.Fatalf("Open with migrate=true: %v", err)
				}
				if ok, err := st.IsProcessed(ctxT(t), "earlier:processed"); err != nil || !ok {
					t.Fatalf("a processed key of the earlier table after Migrate: %v, %v", ok, err)
				}
				_ = st.Close()
			}
			st, err := stores.Open(ctxT(t), raw)
			if err != nil {
				t.Fatalf("Open after Migrate: %v", err)
			}
			defer st.Close()
			c, err := st.TryBegin(ctxT(t), "earlier:new", inbox.BeginOptions{})
			if err != nil || c.Status != inbox.Acquired {
				t.Fatalf("TryBegin: %+v, %v", c, err)
			}
			if err := st.Fail(ctxT(t), "earlier:new", c.LeaseID, inbox.FailOptions{Dead: true, Reason: "r"}); err != nil {
				t.Fatal(err)
			}
			if r, err := st.Get(ctxT(t), "earlier:new"); err != nil || r.State != inbox.StateDead || r.Reason != "r" {
				t.Fatalf("Get: %+v, %v", r, err)
			}
		})
	}
}
