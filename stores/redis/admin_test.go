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

// The cursor round-trips whatever the keys left over hold, and a cursor
// that is not one of List's is refused.
func TestList_cursor_format(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		node string
		scan uint64
		done bool
		rest []string
	}{
		{"", 0, false, nil},
		{"", 12345, false, nil},
		{"127.0.0.1:7000", 0, false, nil},
		{"[::1]:7000", 99, false, []string{"a"}},
		{"", 7, false, []string{"x;1:y", "", "/", "12:", "ünï;cödé"}},
		{"", 0, true, []string{"last;"}},
	} {
		s := redisstore.EncodeCursor(tc.node, tc.scan, tc.done, tc.rest)
		node, scan, done, rest, err := redisstore.DecodeCursor(s)
		if err != nil || node != tc.node || scan != tc.scan || done != tc.done || !slices.Equal(rest, tc.rest) {
			t.Errorf("cursor %q decodes to %q %d %v %q, %v; want %+v", s, node, scan, done, rest, err, tc)
		}
	}
	if s := redisstore.EncodeCursor("", 0, true, nil); s != "" {
		t.Errorf("the end of a listing is %q, want the empty cursor", s)
	}
	c := sharedClient(t)
	s := newStore(t, c, redisstore.Options{})
	for _, bad := range []string{"x", "-1", "1;", "1;3:ab", "1;2:ab;", "1;a:b", "end", "/1", "1;-1:", "127.0.0.1:7000/1"} {
		if _, err := s.List(context.Background(), inbox.ListOptions{Cursor: bad}); !errors.Is(err, inbox.ErrInvalidArgument) {
			t.Errorf("List with cursor %q: %v, want ErrInvalidArgument", bad, err)
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

// With a limit of one, SCAN often returns more keys than the page takes:
// those travel in the cursor, and every key is listed once.
func TestList_keys_beyond_the_limit_travel_in_the_cursor(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, redisstore.Options{Prefix: "p:"})
	want := numberedKeys("key-%04d", 1000)
	markAll(t, c, "p:", want)
	for _, limit := range []int{1, 3} {
		got, cursors := listPages(t, s, inbox.ListOptions{Limit: limit})
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("limit %d: listed %d keys (%d distinct), want each of the %d once", limit, len(got), len(slices.Compact(got)), len(want))
		}
		carried := 0
		for _, cur := range cursors {
			if strings.Contains(cur, ";") {
				carried++
			}
		}
		t.Logf("limit %d: %d pages, %d cursors carried keys", limit, len(cursors)+1, carried)
		if limit == 1 && carried == 0 {
			t.Fatal("no cursor carried keys: the case was not exercised")
		}
	}
}

// A prefix that few keys match does not cost a page per COUNT keys: COUNT
// grows while SCAN finds nothing under it.
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
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("listed %q, want %q", got, want)
	}
	// Without the growth, 20000 keys at COUNT 10 and 16 SCAN calls a page
	// would take 125 pages.
	if len(cursors) >= 10 {
		t.Fatalf("%d pages for 20000 keys, 3 of them under the prefix; want a few", len(cursors)+1)
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

// On Cluster, List scans every master in turn (the cursor names the one it
// is at); a cursor naming another server is refused. A Ring is not scanned.
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
	got, cursors := listPages(t, s, inbox.ListOptions{Limit: 7})
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("listed %d keys (%d distinct), want each of the %d once", len(got), len(slices.Compact(got)), len(want))
	}
	nodes := map[string]bool{}
	for _, cur := range cursors {
		node, _, done, _, err := redisstore.DecodeCursor(cur)
		if err != nil {
			t.Fatal(err)
		}
		if !done {
			nodes[node] = true
		}
	}
	for _, a := range addrs {
		if !nodes[a] {
			t.Errorf("no cursor named master %s (cursors named %v)", a, nodes)
		}
	}
	for _, bad := range []string{"5", "127.0.0.1:1/0"} {
		if _, err := s.List(ctx, inbox.ListOptions{Cursor: bad}); !errors.Is(err, inbox.ErrInvalidArgument) {
			t.Errorf("List with cursor %q on Cluster: %v, want ErrInvalidArgument", bad, err)
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
