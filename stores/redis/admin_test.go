package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
	"github.com/watermill-inbox/inbox/stores/redis/internal/redistest"
)

// listPages pages through s.List with opts until Next is empty, and
// returns the keys listed, in page order, and the cursors it was given.
func listPages(t *testing.T, s inbox.Admin, opts inbox.ListOptions) (keys, cursors []string) {
	t.Helper()
	for {
		p, err := s.List(context.Background(), opts)
		if err != nil {
			t.Fatalf("List(%+v): %v", opts, err)
		}
		if len(p.Items) > opts.Limit {
			t.Fatalf("List returned %d items, over the limit of %d", len(p.Items), opts.Limit)
		}
		for _, it := range p.Items {
			keys = append(keys, it.Key)
		}
		if p.Next == "" {
			return keys, cursors
		}
		if p.Next == opts.Cursor {
			t.Fatalf("List returned its cursor %q again", p.Next)
		}
		if len(cursors) > 100_000 {
			t.Fatal("List: more than 100000 pages")
		}
		cursors = append(cursors, p.Next)
		opts.Cursor = p.Next
	}
}

// markAll writes a processed record for each of keys under prefix, by hand,
// in one pipeline (many keys, fast).
func markAll(t *testing.T, c redis.UniversalClient, prefix string, keys []string) {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UnixMicro()
	p := c.Pipeline()
	for _, k := range keys {
		p.Set(ctx, prefix+k, packRecord(int64(2), "", "", "", int64(0), int64(0), int64(1), now, now, now+time.Hour.Microseconds(), "", int64(0)), time.Hour)
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

func numberedKeys(format string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf(format, i)
	}
	slices.Sort(keys)
	return keys
}

// The cursor is the last key of the previous page: any string continues
// the listing after it, in key order.
func TestList_cursor_is_a_key(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Options{Prefix: prefix})
	markAll(t, c, prefix, []string{"a", "b", "b:1", "c", "d"})
	for _, tc := range []struct {
		cursor string
		want   []string
	}{
		{"", []string{"a", "b", "b:1", "c", "d"}},
		{"a", []string{"b", "b:1", "c", "d"}},
		{"b", []string{"b:1", "c", "d"}},
		{"b:0", []string{"b:1", "c", "d"}},
		{"c", []string{"d"}},
		{"d", nil},
		{"zzz", nil},
	} {
		got, _ := listPages(t, s, inbox.ListOptions{Cursor: tc.cursor, Limit: 2})
		if !slices.Equal(got, tc.want) {
			t.Errorf("List after %q = %q, want %q", tc.cursor, got, tc.want)
		}
	}
}

// The store's prefix and List's are literal: the glob characters of SCAN
// MATCH in them are escaped.
func TestList_prefixes_with_glob_characters(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	base := testPrefix(t, c)
	a := newStore(t, c, redisstore.Options{Prefix: base + "s*:"})
	b := newStore(t, c, redisstore.Options{Prefix: base + "sx*:"})
	markAll(t, c, base+"s*:", []string{"[ab]1", "a1", `q\x`, "q?"})
	markAll(t, c, base+"sx*:", []string{"a2", "[ab]2"})
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"", []string{"[ab]1", "a1", "q?", `q\x`}},
		{"[ab]", []string{"[ab]1"}},
		{"a", []string{"a1"}},
		{`q\`, []string{`q\x`}},
		{"q?", []string{"q?"}},
		{"*", nil},
	} {
		got, _ := listPages(t, a, inbox.ListOptions{Prefix: tc.prefix, Limit: 10})
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("List(prefix %q) = %q, want %q", tc.prefix, got, tc.want)
		}
	}
	if got, _ := listPages(t, b, inbox.ListOptions{Limit: 10}); len(got) != 2 {
		t.Errorf("List of the other store = %q, want its 2 keys", got)
	}
}

// Pages of any size list every key once, in key order, the first page the
// smallest keys, however SCAN returns them.
func TestList_pages_in_key_order(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, redisstore.Options{Prefix: "p:"})
	want := numberedKeys("key-%04d", 300)
	markAll(t, c, "p:", want)
	for _, limit := range []int{1, 7, 1000} {
		got, cursors := listPages(t, s, inbox.ListOptions{Limit: limit})
		if !slices.Equal(got, want) {
			t.Fatalf("limit %d: listed %d keys, want the %d in key order, each once", limit, len(got), len(want))
		}
		if pages, full := len(cursors)+1, (len(want)+limit-1)/limit; pages != full {
			t.Fatalf("limit %d: %d pages, want %d full ones", limit, pages, full)
		}
	}
}

// A state few records are in, among many keys: each page holds the next
// record in that state in key order, wherever SCAN finds it.
func TestList_sparse_state_in_key_order(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, redisstore.Options{Prefix: "p:"})
	keys := numberedKeys("key-%05d", 20_000)
	markAll(t, c, "p:", keys)
	ctx := context.Background()
	dead := []string{keys[0], keys[12345], keys[len(keys)-1]}
	for _, k := range dead {
		if err := s.Forget(ctx, k); err != nil {
			t.Fatal(err)
		}
		claim, err := s.TryBegin(ctx, k, inbox.BeginOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Fail(ctx, k, claim.LeaseID, inbox.FailOptions{Dead: true, Reason: "poison"}); err != nil {
			t.Fatal(err)
		}
	}
	var pages [][]string
	opts := inbox.ListOptions{State: inbox.StateDead, Limit: 1}
	for {
		p, err := s.List(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, keysOf(p.Items))
		if p.Next == "" {
			break
		}
		opts.Cursor = p.Next
	}
	if want := [][]string{dead[:1], dead[1:2], dead[2:]}; !slices.EqualFunc(pages, want, slices.Equal) {
		t.Fatalf("pages %q, want %q", pages, want)
	}
}

// A page examines at most 100000 keys, the smallest after the cursor: over
// more, a state few records are in is listed in pages that may hold fewer
// records than the limit (even none), each ending at the last key it
// examined, so that the listing still holds every record in that state,
// in key order.
func TestList_page_examines_at_most_100000_keys(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, redisstore.Options{Prefix: "p:", Timeout: time.Minute})
	keys := numberedKeys("key-%06d", 110_000)
	for i := 0; i < len(keys); i += 10_000 {
		markAll(t, c, "p:", keys[i:i+10_000])
	}
	ctx := context.Background()
	dead := keys[len(keys)-1]
	if err := s.Forget(ctx, dead); err != nil {
		t.Fatal(err)
	}
	claim, err := s.TryBegin(ctx, dead, inbox.BeginOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(ctx, dead, claim.LeaseID, inbox.FailOptions{Dead: true, Reason: "poison"}); err != nil {
		t.Fatal(err)
	}
	p, err := s.List(ctx, inbox.ListOptions{State: inbox.StateDead, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Items) != 0 || p.Next != keys[99_999] {
		t.Fatalf("first page: %q, next %q; want none, and the 100000th key as the cursor", keysOf(p.Items), p.Next)
	}
	p, err = s.List(ctx, inbox.ListOptions{State: inbox.StateDead, Limit: 10, Cursor: p.Next})
	if err != nil {
		t.Fatal(err)
	}
	if got := keysOf(p.Items); !slices.Equal(got, []string{dead}) || p.Next != "" {
		t.Fatalf("second page: %q, next %q; want the dead key, and the end", got, p.Next)
	}
}

func keysOf(items []inbox.ListItem) []string {
	out := []string{}
	for _, it := range items {
		out = append(out, it.Key)
	}
	return out
}

// A prefix that few keys match costs one page: the whole database is
// scanned for it.
func TestList_sparse_prefix(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, redisstore.Options{Prefix: "p:"})
	ctx := context.Background()
	p := c.Pipeline()
	for i := range 20_000 {
		p.Set(ctx, fmt.Sprintf("other:%d", i), "x", time.Hour)
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{"a", "b", "c"}
	markAll(t, c, "p:", want)
	got, cursors := listPages(t, s, inbox.ListOptions{Limit: 10})
	if !slices.Equal(got, want) || len(cursors) != 0 {
		t.Fatalf("listed %q in %d pages, want %q in one", got, len(cursors)+1, want)
	}
}

// Records past their logical expiry are not listed, though Redis holds
// them; a value the store did not write fails the listing, naming its key.
func TestList_reads_records_as_Get_does(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Options{Prefix: prefix})
	markAll(t, c, prefix, []string{"live"})
	now := time.Now().UnixMicro()
	if err := c.Set(ctx, prefix+"expired", packRecord(int64(2), "", "", "", int64(0), int64(0), int64(1), now-2000, now-2000, now-1000, "", int64(0)), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if got, _ := listPages(t, s, inbox.ListOptions{Limit: 10}); !slices.Equal(got, []string{"live"}) {
		t.Fatalf("listed %q, want only the live record", got)
	}
	if err := c.Set(ctx, prefix+"foreign", "not a record", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	// The page that reaches the foreign value fails; on a shared Redis with
	// many keys that may not be the first one.
	var err error
	for opts := (inbox.ListOptions{Limit: 10}); err == nil; {
		var p inbox.ListPage
		if p, err = s.List(ctx, opts); err == nil && p.Next == "" {
			break
		}
		opts.Cursor = p.Next
	}
	if !errors.Is(err, inbox.ErrStoreUnavailable) || !strings.Contains(err.Error(), prefix+"foreign") {
		t.Fatalf("List over a foreign value: %v, want ErrStoreUnavailable naming its key", err)
	}
}

// On Cluster, List scans every master: one listing in key order over all
// of them. A Ring is not scanned.
func TestList_cluster(t *testing.T) {
	t.Parallel()
	addrs := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, redisstore.Options{Prefix: "p:"})
	ctx := context.Background()
	want := numberedKeys("key-%03d", 300)
	for _, k := range want {
		if err := s.MarkProcessed(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	for _, limit := range []int{7, 1000} {
		if got, _ := listPages(t, s, inbox.ListOptions{Limit: limit}); !slices.Equal(got, want) {
			t.Fatalf("limit %d: listed %d keys, want the %d of the three masters in key order, each once", limit, len(got), len(want))
		}
	}

	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addrs[0]}})
	t.Cleanup(func() { _ = ring.Close() })
	rs := newStore(t, ring, redisstore.Options{Prefix: "p:"})
	if _, err := rs.List(ctx, inbox.ListOptions{}); !errors.Is(err, inbox.ErrNotSupported) {
		t.Fatalf("List on a Ring: %v, want ErrNotSupported", err)
	}
}

// A prefix must end with ':', so that it cannot reach another namespace's
// keys: "app" would make the inbox key "le:1" the Redis key "apple:1"
// (refused, by New and by URL, saying what to use); under "app:", Forget,
// ForceRelease and List of "le:1" never touch the neighbour "apple:"'s keys.
func TestPrefix_stays_in_its_namespace(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	base := testPrefix(t, c)
	_, err := redisstore.New(c, redisstore.Options{Prefix: base + "app"})
	if !errors.Is(err, inbox.ErrInvalidArgument) || !strings.Contains(err.Error(), `"`+base+`app" does not end with ":"`) ||
		!strings.Contains(err.Error(), `use "`+base+`app:"`) {
		t.Fatalf("New with prefix %q: %v; want an invalid argument naming it and the prefix to use", base+"app", err)
	}
	u := withQuery(t, testenv.Redis.URL(t), "prefix="+url.QueryEscape(base+"app")+"&check=false")
	if s, err := stores.Open(context.Background(), u); err == nil {
		_ = s.Close()
		t.Fatal("Open with a prefix without a separator succeeded")
	} else if !errors.Is(err, stores.ErrInvalidURL) || !strings.Contains(err.Error(), "does not end with") {
		t.Fatalf("Open with a prefix without a separator: %v, want an invalid URL saying why", err)
	}

	ctx := context.Background()
	neighbour := base + "apple:1" // another application's key
	if err := c.Set(ctx, neighbour, "theirs", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, c, redisstore.Options{Prefix: base + "app:"})
	if page, err := s.List(ctx, inbox.ListOptions{}); err != nil || len(page.Items) != 0 {
		t.Fatalf("List of an empty store beside %s = %+v, %v; want nothing", neighbour, page, err)
	}
	if err := s.Forget(ctx, "le:1"); err != nil {
		t.Fatal(err)
	}
	if err := s.ForceRelease(ctx, "le:1"); err != nil {
		t.Fatal(err)
	}
	claim, err := s.TryBegin(ctx, "le:1", inbox.BeginOptions{})
	if err != nil || claim.Status != inbox.Acquired {
		t.Fatalf("TryBegin(le:1) = %+v, %v", claim, err)
	}
	if err := s.ForceRelease(ctx, "le:1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := listPages(t, s, inbox.ListOptions{Limit: 10}); !slices.Equal(got, []string{"le:1"}) {
		t.Fatalf("List = %q, want the store's own key only", got)
	}
	if err := s.Forget(ctx, "le:1"); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, neighbour).Result(); err != nil || v != "theirs" {
		t.Fatalf("the neighbour's key %s after the store's calls: %q, %v; want it untouched", neighbour, v, err)
	}
	if n, err := c.Exists(ctx, base+"app:le:1").Result(); err != nil || n != 0 {
		t.Fatalf("the store's own key after Forget: exists %d, %v", n, err)
	}
}
