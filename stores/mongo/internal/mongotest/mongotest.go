// Package mongotest holds the tests and benchmarks of the MongoDB store that
// run against a server: the same code runs against FerretDB in-process
// (module stores/mongo/ferrettest) and against a real mongod when
// INBOX_TEST_MONGO_URL is set (package mongostore's own tests). It uses the
// store's public API only.
package mongotest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/faultproxy"
	"github.com/watermill-inbox/inbox/stores"
	mongostore "github.com/watermill-inbox/inbox/stores/mongo"
	"github.com/watermill-inbox/inbox/stores/storetest"
)

// Database is the database the tests and benchmarks use. Each test makes its
// own collections in it, with random names, and drops them.
const Database = "inbox_test"

// Server is the server under test.
type Server struct {
	// URI is a MongoDB connection string of the server, without a
	// database.
	URI string

	// NotAtomic, when set, says why concurrent claims are not atomic on this
	// server; the suite's concurrency cases skip with it.
	NotAtomic string

	// TTL states whether the server creates TTL indexes: mongod does,
	// FerretDB 1.x refuses them.
	TTL bool

	// FaultsURI, when set, is the server of the conformance suite's fault
	// cases (a connection string as URI): a server of their own, so that
	// their load does not slow the other cases down. Default URI.
	FaultsURI string

	// FaultCallers is the conformance suite's Harness.FaultCallers: how
	// many callers its case of a link cut under load runs at once. Zero is
	// the suite's default (64).
	FaultCallers int
}

// Connect returns a client of uri, disconnected when the test ends.
func Connect(tb testing.TB, uri string) *mongo.Client {
	tb.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		tb.Fatalf("connecting to %s: %v", uri, err)
	}
	tb.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	return c
}

// Collection returns a fresh collection name, dropped when the test ends.
func Collection(tb testing.TB, client *mongo.Client, prefix string) string {
	tb.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := prefix + "_" + hex.EncodeToString(b[:])
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := client.Database(Database).Collection(name).Drop(ctx); err != nil {
			tb.Errorf("dropping collection %s: %v", name, err)
		}
	})
	return name
}

// NewStore returns a store over client on collection, closed when the test
// ends. opts.Database and opts.Collection are filled in.
func NewStore(tb testing.TB, client *mongo.Client, collection string, opts mongostore.Options) *mongostore.Store {
	tb.Helper()
	opts.Database, opts.Collection = Database, collection
	if opts.Logger == nil {
		opts.Logger = watermill.NopLogger{}
	}
	s, err := mongostore.New(context.Background(), client, opts)
	if err != nil {
		tb.Fatalf("mongostore.New: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Run runs the conformance suite and the store's own tests against srv.
func Run(t *testing.T, srv Server) {
	client := Connect(t, srv.URI)
	t.Run("Conformance", func(t *testing.T) {
		coll := Collection(t, client, "storetest")
		storetest.Run(t, storetest.Harness{
			New: func(t *testing.T, cfg storetest.Config) inbox.LeaseStore {
				// A bound well above the default: FerretDB in-process over
				// SQLite runs one write at a time, tens of ms each under
				// -race, and the suite's concurrency cases make some 60
				// calls at once while the other cases run.
				return NewStore(t, client, coll, mongostore.Options{Retention: cfg.Retention, Timeout: 30 * time.Second})
			},
			TimePrecision: time.Millisecond, // BSON dates
			NotAtomic:     srv.NotAtomic,
			Faults:        faults(cmp.Or(srv.FaultsURI, srv.URI)),
			CallTimeout:   faultCallTimeout,
			FaultCallers:  srv.FaultCallers,
		})
	})
	t.Run("Clock_hosts_with_skewed_clocks_agree", func(t *testing.T) {
		t.Parallel()
		testSkewedClocks(t, client)
	})
	t.Run("Clock_resync_corrects_a_fast_local_clock", func(t *testing.T) {
		t.Parallel()
		testClockResync(t, client)
	})
	t.Run("Busy_under_concurrency_never_waits_past_the_lease", func(t *testing.T) {
		t.Parallel()
		testBusyWithinLease(t, client)
	})
	t.Run("List_prefix_is_a_range_of_keys_not_a_pattern", func(t *testing.T) {
		t.Parallel()
		testListPrefix(t, client)
	})
	t.Run("Fail_document_layout", func(t *testing.T) {
		t.Parallel()
		testFailLayout(t, client)
	})
	t.Run("EnsureIndexes", func(t *testing.T) {
		t.Parallel()
		testEnsureIndexes(t, client, srv.TTL)
	})
	t.Run("Errors_no_driver_error_leaks", func(t *testing.T) {
		t.Parallel()
		testNoDriverErrors(t, client)
	})
	t.Run("Errors_outage_is_store_unavailable", func(t *testing.T) {
		t.Parallel()
		testOutage(t, srv.URI)
	})
	t.Run("Close_leaves_the_callers_client_connected", func(t *testing.T) {
		t.Parallel()
		testClose(t, client)
	})
	t.Run("OpenURL", func(t *testing.T) {
		t.Parallel()
		testOpenURL(t, client, srv.URI)
	})
}

// faultCallTimeout is the Timeout of the stores the fault cases break, as
// the conformance suite's own: FerretDB in-process over SQLite runs one
// write at a time, tens of ms each under -race, while the suite's other
// cases run.
const faultCallTimeout = 30 * time.Second

// faults gives the conformance suite's fault cases a store whose client
// reaches the server (the first host of uri, directly) through a
// faultproxy of its own, so that cutting or slowing that link disturbs no
// other subtest, on a collection of its own (FerretDB scans the whole
// collection for each conditional write).
func faults(uri string) func(t *testing.T, cfg storetest.Config) (inbox.LeaseStore, storetest.Link) {
	return func(t *testing.T, cfg storetest.Config) (inbox.LeaseStore, storetest.Link) {
		direct := Connect(t, uri)
		proxy := faultproxy.New(t, firstHost(t, uri))
		client := Connect(t, viaProxy(t, uri, proxy.Addr()))
		coll := Collection(t, direct, "faults")
		return NewStore(t, client, coll, mongostore.Options{Retention: cfg.Retention, Timeout: faultCallTimeout}), proxy
	}
}

// testSkewedClocks runs two stores whose hosts' clocks are two hours apart:
// both must see one deadline, the server's, for the same lease.
func testSkewedClocks(t *testing.T, client *mongo.Client) {
	coll := Collection(t, client, "skew")
	ahead := NewStore(t, client, coll, mongostore.Options{LocalClock: func() time.Time { return time.Now().Add(time.Hour) }})
	behind := NewStore(t, client, coll, mongostore.Options{LocalClock: func() time.Time { return time.Now().Add(-time.Hour) }})
	const lease = 30 * time.Second

	key := "skew:" + inbox.NewLeaseID()
	c, err := ahead.TryBegin(ctxT(t), key, inbox.BeginOptions{Lease: lease})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin on the host an hour ahead = %+v, %v; want Acquired", c, err)
	}
	// The deadline is on the server's clock, not an hour off.
	if d := c.ExpiresAt.Sub(serverTime(t, client).Add(lease)); d > 5*time.Second || d < -5*time.Second {
		t.Fatalf("deadline %s from the host an hour ahead is %s off the server's clock", c.ExpiresAt, d)
	}
	b, err := behind.TryBegin(ctxT(t), key, inbox.BeginOptions{Lease: lease})
	if err != nil || b.Status != inbox.Busy {
		t.Fatalf("TryBegin on the host an hour behind = %+v, %v; want Busy", b, err)
	}
	if d := b.ExpiresAt.Sub(c.ExpiresAt); d != 0 {
		t.Fatalf("the host an hour behind sees deadline %s, the holder %s", b.ExpiresAt, c.ExpiresAt)
	}
	if b.RetryAfter <= lease-5*time.Second || b.RetryAfter > lease {
		t.Fatalf("the host an hour behind sees RetryAfter %s for a %s lease just taken", b.RetryAfter, lease)
	}
	// And the other way round: the host behind holds, the host ahead must
	// not see the lease as expired.
	key2 := "skew:" + inbox.NewLeaseID()
	if c, err := behind.TryBegin(ctxT(t), key2, inbox.BeginOptions{Lease: lease}); err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin on the host an hour behind = %+v, %v; want Acquired", c, err)
	}
	if b, err := ahead.TryBegin(ctxT(t), key2, inbox.BeginOptions{Lease: lease}); err != nil || b.Status != inbox.Busy {
		t.Fatalf("TryBegin on the host an hour ahead of the holder = %+v, %v; want Busy", b, err)
	}
}

// serverTime reads the server's clock.
func serverTime(t *testing.T, client *mongo.Client) time.Time {
	t.Helper()
	raw, err := client.Database("admin").RunCommand(ctxT(t), bson.D{{Key: "hello", Value: 1}}).Raw()
	if err != nil {
		t.Fatalf("hello: %v", err)
	}
	lt, ok := raw.Lookup("localTime").TimeOK()
	if !ok {
		t.Fatalf("hello has no localTime: %s", raw)
	}
	return lt
}

// testClockResync runs a store whose local clock then jumps two minutes
// ahead, as a fast clock would drift: the store must notice the estimate is
// stale, read the server's clock again, and still see a 30 s lease taken a
// moment ago as live.
func testClockResync(t *testing.T, client *mongo.Client) {
	var skew atomic.Int64
	s := NewStore(t, client, Collection(t, client, "resync"), mongostore.Options{
		LocalClock: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) },
	})
	key := "resync:" + inbox.NewLeaseID()
	c, err := s.TryBegin(ctxT(t), key, inbox.BeginOptions{Lease: 30 * time.Second})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin = %+v, %v; want Acquired", c, err)
	}
	skew.Store(int64(2 * time.Minute))
	r, err := s.Get(ctxT(t), key)
	if err != nil || r.State != inbox.StateInProgress {
		t.Fatalf("after the local clock ran 2 minutes ahead, Get = %+v, %v; want the 30 s lease still InProgress", r, err)
	}
	b, err := s.TryBegin(ctxT(t), key, inbox.BeginOptions{})
	if err != nil || b.Status != inbox.Busy || b.RetryAfter <= 20*time.Second {
		t.Fatalf("after the local clock ran 2 minutes ahead, TryBegin = %+v, %v; want Busy for most of 30 s", b, err)
	}
}

// testBusyWithinLease races TryBegin calls on fresh keys. Whoever wins (on a
// server without atomic updates, several may), a Busy answer must never ask
// to wait longer than the lease: a racer that read the clock before the
// winner stamped its deadline must not measure from its older reading.
func testBusyWithinLease(t *testing.T, client *mongo.Client) {
	s := NewStore(t, client, Collection(t, client, "busy"), mongostore.Options{})
	const lease = 30 * time.Second
	for round := range 5 {
		key := "busy:" + strconv.Itoa(round) + ":" + inbox.NewLeaseID()
		var wg sync.WaitGroup
		start := make(chan struct{})
		claims := make([]inbox.Claim, 20)
		errs := make([]error, len(claims))
		for i := range claims {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				claims[i], errs[i] = s.TryBegin(ctxT(t), key, inbox.BeginOptions{Lease: lease})
			}()
		}
		close(start)
		wg.Wait()
		for i, c := range claims {
			if errs[i] != nil {
				t.Fatalf("racer %d: %v", i, errs[i])
			}
			if c.Status == inbox.Busy && (c.RetryAfter <= 0 || c.RetryAfter > lease || c.BackingOff) {
				t.Fatalf("racer %d: Busy with RetryAfter %s for a %s lease (BackingOff %v, want false)", i, c.RetryAfter, lease, c.BackingOff)
			}
		}
	}
}

// testListPrefix lists under a prefix that holds regular expression
// syntax, with keys that a pattern would mix up: only the keys that start
// with the prefix, byte for byte, come back, in order, once each.
func testListPrefix(t *testing.T, client *mongo.Client) {
	s := NewStore(t, client, Collection(t, client, "list"), mongostore.Options{})
	base := "list:" + inbox.NewLeaseID() + ":"
	prefix := base + ".*[\\d"
	want := []string{prefix, prefix + "a", prefix + "%_", prefix + "é", prefix + "\U0010ffff", prefix + "\U0010ffff\U0010ffff", prefix + "~"}
	others := []string{base + "x", base + ".*[\\", base + ".*[\\e", base + ".", base + ".*[\\D", base + "/*[\\d"}
	for _, k := range append(append([]string{}, want...), others...) {
		if err := s.MarkProcessed(ctxT(t), k); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(want)
	var got []string
	opts := inbox.ListOptions{Prefix: prefix, Limit: 2}
	for pages := 0; ; pages++ {
		if pages > len(want) {
			t.Fatalf("List: more pages than keys; is Next advancing? got %q", got)
		}
		p, err := s.List(ctxT(t), opts)
		if err != nil {
			t.Fatalf("List(%+v): %v", opts, err)
		}
		for _, it := range p.Items {
			got = append(got, it.Key)
		}
		if p.Next == "" {
			break
		}
		opts.Cursor = p.Next
	}
	if !slices.Equal(got, want) {
		t.Fatalf("List(prefix %q) = %q, want %q", prefix, got, want)
	}
	// The prefix ending in the greatest code point has no upper bound of
	// its own: the range is cut one code point before.
	p, err := s.List(ctxT(t), inbox.ListOptions{Prefix: prefix + "\U0010ffff"})
	if err != nil || len(p.Items) != 2 {
		t.Fatalf("List(prefix ending in U+10FFFF) = %+v, %v; want its 2 keys", p, err)
	}
}

// testFailLayout checks the documents a failed attempt leaves, as the
// package documentation describes them.
func testFailLayout(t *testing.T, client *mongo.Client) {
	coll := Collection(t, client, "layout")
	s := NewStore(t, client, coll, mongostore.Options{})
	read := func(key string) bson.M {
		t.Helper()
		var d bson.M
		if err := client.Database(Database).Collection(coll).FindOne(ctxT(t), bson.D{{Key: "_id", Value: key}}).Decode(&d); err != nil {
			t.Fatalf("reading the document of %q: %v", key, err)
		}
		return d
	}
	key := "layout:" + inbox.NewLeaseID()
	c, err := s.TryBegin(ctxT(t), key, inbox.BeginOptions{Lease: time.Minute})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin = %+v, %v", c, err)
	}
	if d := read(key); d["dead"] != false || d["reason"] != "" || d["retryAt"] == nil {
		t.Fatalf("a new record: %v; want dead false, reason \"\", retryAt the epoch", d)
	}
	if err := s.Fail(ctxT(t), key, c.LeaseID, inbox.FailOptions{RetryAfter: time.Hour, Reason: "later"}); err != nil {
		t.Fatal(err)
	}
	d := read(key)
	retryAt, _ := d["retryAt"].(bson.DateTime)
	expiresAt, _ := d["expiresAt"].(bson.DateTime)
	if d["leaseId"] != "" || d["reason"] != "later" || d["dead"] != false || retryAt.Time().Before(time.Now().Add(50*time.Minute)) ||
		expiresAt.Time().Sub(retryAt.Time()) != inbox.DefaultRetention {
		t.Fatalf("after Fail with a backoff of 1h: %v; want no lease id, the reason, retryAt in an hour, expiresAt a retention after it", d)
	}
	c, err = s.TryBegin(ctxT(t), key, inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Busy || c.Attempts != 1 || !c.BackingOff || !c.ExpiresAt.Equal(retryAt.Time().UTC()) {
		t.Fatalf("TryBegin during the backoff = %+v, %v; want Busy, BackingOff, until retryAt %v, after 1 attempt", c, err, retryAt.Time().UTC())
	}
	if err := s.ForceRelease(ctxT(t), key); err != nil {
		t.Fatal(err)
	}
	c, err = s.TryBegin(ctxT(t), key, inbox.BeginOptions{Lease: time.Minute})
	if err != nil || c.Status != inbox.Acquired || c.Attempts != 2 {
		t.Fatalf("TryBegin after ForceRelease = %+v, %v; want Acquired, attempt 2", c, err)
	}
	if err := s.Fail(ctxT(t), key, c.LeaseID, inbox.FailOptions{Dead: true, Reason: "poison"}); err != nil {
		t.Fatal(err)
	}
	if d := read(key); d["dead"] != true || d["reason"] != "poison" || d["attempts"] != int64(2) {
		t.Fatalf("after Fail with Dead: %v; want dead true, the reason, 2 attempts", d)
	}
	if err := s.Forget(ctxT(t), key); err != nil {
		t.Fatal(err)
	}
	if n, err := client.Database(Database).Collection(coll).CountDocuments(ctxT(t), bson.D{{Key: "_id", Value: key}}); err != nil || n != 0 {
		t.Fatalf("after Forget: %d documents of the key, %v; want none", n, err)
	}
}

// captureLogger keeps the error-level messages.
type captureLogger struct {
	watermill.NopLogger
	errs chan string
}

func (l captureLogger) Error(msg string, err error, _ watermill.LogFields) {
	l.errs <- msg + ": " + err.Error()
}

func (l captureLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// ttlIndex returns the TTL index of collection coll, nil when it has none.
func ttlIndex(t *testing.T, client *mongo.Client, coll string) bson.M {
	t.Helper()
	cur, err := client.Database(Database).Collection(coll).Indexes().List(ctxT(t))
	if err != nil {
		t.Fatalf("listing indexes: %v", err)
	}
	var idx []bson.M
	if err := cur.All(ctxT(t), &idx); err != nil {
		t.Fatalf("reading indexes: %v", err)
	}
	for _, ix := range idx {
		if ix["name"] == mongostore.TTLIndexName {
			return ix
		}
	}
	return nil
}

// New creates the TTL index with the collection (a server that refuses it
// logs the refusal, naming it, and the store works on); EnsureIndexes is
// idempotent; Options.NoTTLIndex creates none and logs nothing.
func testEnsureIndexes(t *testing.T, client *mongo.Client, ttl bool) {
	coll := Collection(t, client, "indexes")
	logs := captureLogger{errs: make(chan string, 10)}
	s := NewStore(t, client, coll, mongostore.Options{Logger: logs})
	check := func(when string, refusals int) {
		t.Helper()
		found := ttlIndex(t, client, coll)
		if ttl {
			if found == nil {
				t.Fatalf("no index %s %s", mongostore.TTLIndexName, when)
			}
			if v, ok := found["expireAfterSeconds"]; !ok || fmt.Sprint(v) != "0" {
				t.Fatalf("index %s has expireAfterSeconds %v (%T), want 0", mongostore.TTLIndexName, v, v)
			}
			if len(logs.errs) != 0 {
				t.Fatalf("a server that takes TTL indexes: an error logged %s: %s", when, <-logs.errs)
			}
			return
		}
		if found != nil {
			t.Fatalf("a server said to refuse TTL indexes has index %v %s", found, when)
		}
		if len(logs.errs) != refusals {
			t.Fatalf("a server refusing TTL indexes: %d errors logged %s, want %d (one per attempt)", len(logs.errs), when, refusals)
		}
	}
	check("after New", 1)
	for i := range 2 { // idempotent
		if err := s.EnsureIndexes(ctxT(t)); err != nil {
			t.Fatalf("EnsureIndexes #%d: %v", i+1, err)
		}
	}
	check("after New and two EnsureIndexes", 3)
	if !ttl {
		msg := <-logs.errs
		if !strings.Contains(msg, "refused the TTL index") || !strings.Contains(msg, "expiresAt") {
			t.Fatalf("the error logged does not say what was refused: %q", msg)
		}
	}
	// The store works, expiry being logical.
	c, err := s.TryBegin(ctxT(t), "after-ttl-index", inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin after New = %+v, %v", c, err)
	}

	none := Collection(t, client, "no-ttl")
	quiet := captureLogger{errs: make(chan string, 10)}
	s2 := NewStore(t, client, none, mongostore.Options{Logger: quiet, NoTTLIndex: true})
	if err := s2.MarkProcessed(ctxT(t), "k"); err != nil { // creates the collection
		t.Fatal(err)
	}
	if found := ttlIndex(t, client, none); found != nil || len(quiet.errs) != 0 {
		t.Fatalf("NoTTLIndex: index %v, %d errors logged; want neither", found, len(quiet.errs))
	}
}

func testNoDriverErrors(t *testing.T, client *mongo.Client) {
	s := NewStore(t, client, Collection(t, client, "errors"), mongostore.Options{})
	ctx := ctxT(t)
	key := "unknown:" + inbox.NewLeaseID()
	id := inbox.NewLeaseID()
	_, extendErr := s.Extend(ctx, key, id, time.Second)
	for name, err := range map[string]error{
		"Complete": s.Complete(ctx, key, id),
		"Release":  s.Release(ctx, key, id),
		"Extend":   extendErr,
	} {
		if !errors.Is(err, inbox.ErrLeaseLost) {
			t.Errorf("%s of an unknown key: %v, want ErrLeaseLost", name, err)
		}
		if errors.Is(err, mongo.ErrNoDocuments) {
			t.Errorf("%s of an unknown key leaks mongo.ErrNoDocuments: %v", name, err)
		}
		if want := "mongo store: " + name + " " + strconv.Quote(key) + ": "; err != nil && !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%s of an unknown key: %q does not start with %q", name, err, want)
		}
	}
	if r, err := s.Get(ctx, key); err != nil || r.State != inbox.StateNotFound {
		t.Errorf("Get of an unknown key = %+v, %v; want NotFound, nil", r, err)
	}
	if ok, err := s.IsProcessed(ctx, key); err != nil || ok {
		t.Errorf("IsProcessed of an unknown key = %v, %v; want false, nil", ok, err)
	}
}

// firstHost returns the first host:port of uri.
func firstHost(t *testing.T, uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	h := strings.Split(u.Host, ",")[0]
	if !strings.Contains(h, ":") {
		h += ":27017"
	}
	return h
}

// viaProxy returns uri with its host replaced by addr, talking to that one
// server only (directConnection), so that the proxy sees every round trip.
// Connections the proxy stalled stay open after Restore: a short connect
// timeout lets the driver drop them soon.
func viaProxy(t *testing.T, uri, addr string) string {
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	q := u.Query()
	q.Set("directConnection", "true")
	q.Set("connectTimeoutMS", "2000")
	u.RawQuery = q.Encode()
	return u.String()
}

// testOutage talks to the first host of uri directly: with a replica set,
// name the primary first in INBOX_TEST_MONGO_URL.
func testOutage(t *testing.T, uri string) {
	proxy := faultproxy.New(t, firstHost(t, uri))
	client := Connect(t, viaProxy(t, uri, proxy.Addr()))
	coll := Collection(t, Connect(t, uri), "outage")
	s := NewStore(t, client, coll, mongostore.Options{Timeout: 2 * time.Second})
	key := "outage:" + inbox.NewLeaseID()
	c, err := s.TryBegin(ctxT(t), key, inbox.BeginOptions{Lease: time.Minute})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin through the proxy = %+v, %v", c, err)
	}

	check := func(what string, err error, also error) {
		t.Helper()
		if !errors.Is(err, inbox.ErrStoreUnavailable) {
			t.Fatalf("%s: %v, want ErrStoreUnavailable", what, err)
		}
		if also != nil && !errors.Is(err, also) {
			t.Fatalf("%s: %v, want it to wrap %v too", what, err, also)
		}
		var se mongo.ServerError
		if errors.As(err, &se) {
			t.Fatalf("%s: the driver's error type leaks: %T", what, se)
		}
	}
	proxy.Cut()
	_, err = s.TryBegin(ctxT(t), key, inbox.BeginOptions{})
	check("TryBegin with the link cut", err, nil)
	check("Complete with the link cut", s.Complete(ctxT(t), key, c.LeaseID), nil)

	proxy.Stall()
	start := time.Now()
	_, err = s.Get(ctxT(t), key)
	check("Get with the link stalled", err, context.DeadlineExceeded)
	if e := time.Since(start); e > 20*time.Second {
		t.Fatalf("Get with the link stalled took %s, Options.Timeout is 2s", e)
	}
	// A caller that gives up while the link is stalled gets context.Canceled.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	_, err = s.Get(ctx, key)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Get canceled while the link stalled: %v, want context.Canceled", err)
	}

	proxy.Restore()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err = s.Complete(ctxT(t), key, c.LeaseID)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Complete after the link came back: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // polling interval: the outcome decides
	}
	if r, err := s.Get(ctxT(t), key); err != nil || r.State != inbox.StateProcessed {
		t.Fatalf("Get after recovery = %+v, %v; want Processed", r, err)
	}
}

func testClose(t *testing.T, client *mongo.Client) {
	coll := Collection(t, client, "close")
	// A negative Timeout turns the store's own bound off: calls still work.
	s := NewStore(t, client, coll, mongostore.Options{Timeout: -1})
	if c, err := s.TryBegin(ctxT(t), "k", inbox.BeginOptions{}); err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin with Timeout -1 = %+v, %v; want Acquired", c, err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := s.TryBegin(ctxT(t), "k2", inbox.BeginOptions{}); !errors.Is(err, inbox.ErrClosed) {
		t.Fatalf("TryBegin after Close: %v, want ErrClosed", err)
	}
	if err := client.Ping(ctxT(t), nil); err != nil {
		t.Fatalf("the caller's client after Close: %v", err)
	}
}

func testOpenURL(t *testing.T, client *mongo.Client, uri string) {
	coll := Collection(t, client, "url")
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + Database
	q := u.Query()
	q.Set("collection", coll)
	q.Set("lease", "7s")
	q.Set("retention", "1h")
	q.Set("timeout", "5s")
	q.Set("appName", "inbox-mongotest") // a driver option, passed through
	q.Set("ensure_indexes", "true")     // a refused TTL index only warns
	u.RawQuery = q.Encode()
	s, err := stores.Open(ctxT(t), u.String())
	if err != nil {
		t.Fatalf("stores.Open: %v", err)
	}
	defer s.Close()
	key := "url:" + inbox.NewLeaseID()
	c, err := s.TryBegin(ctxT(t), key, inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired || c.Lease != 7*time.Second {
		t.Fatalf("TryBegin through a URL-opened store = %+v, %v; want Acquired with the URL's 7s lease", c, err)
	}
	var d bson.M
	if err := client.Database(Database).Collection(coll).FindOne(ctxT(t), bson.D{{Key: "_id", Value: key}}).Decode(&d); err != nil {
		t.Fatalf("the URL's collection %s has no document for the key: %v", coll, err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close of a URL-opened store: %v", err)
	}
	if _, err := s.Get(ctxT(t), key); !errors.Is(err, inbox.ErrClosed) {
		t.Fatalf("Get after Close: %v, want ErrClosed", err)
	}
}

// Bench measures, in one run, a raw InsertOne of a document like the
// store's (the baseline) against the store's calls. Each sub-benchmark
// starts from an empty collection that grows by b.N records, so compare runs
// of a fixed count (-benchtime 100x): on a server whose cost grows with the
// collection the ratio depends on it.
func Bench(b *testing.B, uri string) {
	// A loaded machine must not fail a benchmark: no 5 s bound per call.
	benchOpts := mongostore.Options{Timeout: time.Minute}
	client := Connect(b, uri)
	doc := func(key string) bson.D {
		now := time.Now()
		return bson.D{
			{Key: "_id", Value: key}, {Key: "leaseId", Value: inbox.NewLeaseID()}, {Key: "leaseUntil", Value: now.Add(time.Minute)},
			{Key: "processed", Value: false}, {Key: "attempts", Value: int64(1)}, {Key: "firstSeen", Value: now},
			{Key: "lastSeen", Value: now}, {Key: "expiresAt", Value: now.Add(time.Hour)}, {Key: "owner", Value: "bench"},
			{Key: "payloadHash", Value: ""},
		}
	}
	prefix := inbox.NewLeaseID()
	key := func(i int) string { return "bench:" + prefix + ":" + strconv.Itoa(i) }
	ctx := context.Background()

	b.Run("InsertOne_baseline", func(b *testing.B) {
		coll := client.Database(Database).Collection(Collection(b, client, "bench"))
		b.ResetTimer()
		for i := range b.N {
			if _, err := coll.InsertOne(ctx, doc(key(i))); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("TryBegin_Complete", func(b *testing.B) {
		s := NewStore(b, client, Collection(b, client, "bench"), benchOpts)
		b.ResetTimer()
		for i := range b.N {
			c, err := s.TryBegin(ctx, key(i), inbox.BeginOptions{Owner: "bench"})
			if err != nil || c.Status != inbox.Acquired {
				b.Fatalf("TryBegin = %+v, %v", c, err)
			}
			if err := s.Complete(ctx, key(i), c.LeaseID); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The same with 1000 other records in the collection: a server that
	// finds the document by _id whatever the rest of the filter stays flat;
	// one that scans (FerretDB 1.24 on SQLite) slows down with the records.
	b.Run("TryBegin_Complete_1k_records", func(b *testing.B) {
		coll := Collection(b, client, "bench")
		var fill []any
		for i := range 1000 {
			fill = append(fill, doc("fill:"+strconv.Itoa(i)))
		}
		if _, err := client.Database(Database).Collection(coll).InsertMany(ctx, fill); err != nil {
			b.Fatal(err)
		}
		s := NewStore(b, client, coll, benchOpts)
		b.ResetTimer()
		for i := range b.N {
			c, err := s.TryBegin(ctx, key(i), inbox.BeginOptions{Owner: "bench"})
			if err != nil || c.Status != inbox.Acquired {
				b.Fatalf("TryBegin = %+v, %v", c, err)
			}
			if err := s.Complete(ctx, key(i), c.LeaseID); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("TryBegin_processed_duplicate", func(b *testing.B) {
		s := NewStore(b, client, Collection(b, client, "bench"), benchOpts)
		if err := s.MarkProcessed(ctx, "dup"); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			if c, err := s.TryBegin(ctx, "dup", inbox.BeginOptions{}); err != nil || c.Status != inbox.Processed {
				b.Fatalf("TryBegin = %+v, %v", c, err)
			}
		}
	})
}
