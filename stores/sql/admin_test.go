package sqlstore_test

import (
	"slices"
	"testing"

	"github.com/watermill-inbox/inbox"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
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
