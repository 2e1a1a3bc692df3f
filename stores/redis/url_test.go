package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
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

// withQuery returns raw with the query parameters q added.
func withQuery(t *testing.T, raw, q string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if u.RawQuery != "" {
		u.RawQuery += "&"
	}
	u.RawQuery += q
	return u.String()
}

func TestOpenURL_standalone(t *testing.T) {
	t.Parallel()
	base := testenv.Redis.URL(t)
	c := sharedClient(t)
	prefix := testPrefix(t, c)
	ctx := context.Background()
	s, err := stores.Open(ctx, withQuery(t, base, "prefix="+url.QueryEscape(prefix)+"&lease=7s&retention=1h&timeout=2s&dial_timeout=1s&pool_size=4"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := s.TryBegin(ctx, "k", inbox.BeginOptions{})
	if err != nil || cl.Status != inbox.Acquired || cl.Lease != 7*time.Second {
		t.Fatalf("TryBegin through a URL-opened store: %+v, %v; want Acquired with the URL's 7s lease", cl, err)
	}
	// The key is under the URL's prefix, with the URL's retention as TTL.
	ttl, err := c.PTTL(ctx, prefix+"k").Result()
	if err != nil || ttl <= time.Hour || ttl > time.Hour+8*time.Second {
		t.Fatalf("PTTL of the record = %s, %v; want lease + retention (1h7s)", ttl, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "k"); !errors.Is(err, inbox.ErrClosed) {
		t.Fatalf("Get after Close: %v, want ErrClosed", err)
	}
}

func TestOpenURL_cluster(t *testing.T) {
	t.Parallel()
	addrs := redistest.StartCluster(t, 3)
	ctx := context.Background()
	for _, raw := range []string{
		"redis://" + addrs[0] + "?addr=" + addrs[1] + "&addr=" + addrs[2],
		"redis://" + addrs[1] + "/?cluster=true&timeout=3s",
	} {
		s, err := stores.Open(ctx, raw)
		if err != nil {
			t.Fatalf("Open(%q): %v", raw, err)
		}
		// Enough keys to land on every master: a standalone client would
		// get MOVED errors for most of them.
		for i := range 30 {
			key := "k" + strings.Repeat("x", i)
			if err := s.MarkProcessed(ctx, key); err != nil {
				t.Fatalf("MarkProcessed(%q) through %q: %v", key, raw, err)
			}
		}
		_ = s.Close()
	}
	// A standalone client of a Cluster node would get MOVED for most keys:
	// Open says to add cluster=true.
	_, err := stores.Open(ctx, "redis://"+addrs[0]+"/0")
	if !errors.Is(err, stores.ErrMisconfigured) || !strings.Contains(err.Error(), "is a Redis Cluster node: add cluster=true") {
		t.Fatalf("Open of a Cluster node without cluster=true: %v; want ErrMisconfigured saying to add cluster=true", err)
	}
}

func TestOpenURL_rejects_bad_parameters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, raw := range []string{
		"redis://127.0.0.1:6379/15?prefx=a",               // typo of ours
		"redis://127.0.0.1:6379/15?dial_timeout=x",        // bad go-redis value
		"redis://127.0.0.1:6379/15?no_such_option=1",      // unknown to go-redis too
		"redis://127.0.0.1:6379/15?timeout=-1s",           // not positive
		"redis://127.0.0.1:6379/15?timeout=1s&timeout=2s", // repeated
		"redis://127.0.0.1:6379/15?complete_delay=5ms",    // a parameter of the past
		"redis://127.0.0.1:6379/15?cluster=maybe",
		"redis://127.0.0.1:6379/15?conn_check=sometimes",
		"redis://127.0.0.1:6379/3?cluster=true", // Cluster has only db 0
		"redis://127.0.0.1:6379/notanumber",
		"redis://127.0.0.1:6379/15?prefix=" + strings.Repeat("p", redisstore.MaxPrefixLen+1),
		"redis://127.0.0.1:6379/15?retention=100us",
		"redis://127.0.0.1:6379/15?pool_size=-1", // go-redis panics on it
		"redis://127.0.0.1:6379?addr=127.0.0.1:6380&max_idle_conns=1000000000",
		"redis://127.0.0.1:26379/0?master_name=m&cluster=true", // Sentinel or Cluster
		"redis://127.0.0.1:26379/0?master_name=",
		"redis://127.0.0.1:26379/0?master_name=m&master_name=n",
		"redis://127.0.0.1:26379/0?master_name=m&route_by_latency=true", // go-redis panics on it
		"redis://127.0.0.1:26379/0?master_name=m&route_randomly=true",
		"redis://127.0.0.1:26379/0?master_name=m&replica_only=true", // writes would go to replicas
		"redis://127.0.0.1:26379/0?master_name=m&addr=nocolon",
		"redis://127.0.0.1:26379/0?master_name=m&pool_size=-1",
	} {
		if _, err := stores.Open(ctx, raw); !errors.Is(err, stores.ErrInvalidURL) {
			t.Errorf("Open(%q): %v, want ErrInvalidURL", raw, err)
		}
	}
	// An unknown parameter is refused by name.
	for _, name := range []string{"prefx", "no_such_option", "complete_delay"} {
		_, err := stores.Open(ctx, "redis://127.0.0.1:6379/15?"+name+"=1")
		if !errors.Is(err, stores.ErrInvalidURL) || !strings.Contains(err.Error(), name) {
			t.Errorf("Open with parameter %s: %v, want ErrInvalidURL naming it", name, err)
		}
	}
}

func TestOpenURL_never_shows_password(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"redis://user:s3cr3t-pw@127.0.0.1:6379/15?bogus=1",
		"rediss://:s3cr3t-pw@127.0.0.1:6379/15?timeout=forever",
		"redis://user:s3cr3t-pw@127.0.0.1:6379/7?cluster=true",
		"redis://:s3cr3t-pw@127.0.0.1:26379/0?master_name=m&password=s3cr3t-pw&bogus=1",
		"redis://127.0.0.1:26379/0?master_name=m&password=s3cr3t-pw&replica_only=true",
	} {
		_, err := stores.Open(context.Background(), raw)
		if err == nil {
			t.Fatalf("Open(%q) succeeded", raw)
		}
		if strings.Contains(err.Error(), "s3cr3t-pw") {
			t.Errorf("error quotes the password: %v", err)
		}
	}
}

func TestNew_validates_options(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	for name, tc := range map[string]struct {
		opts redisstore.Options
		want error
	}{
		"negative retention": {redisstore.Options{Retention: -time.Second}, inbox.ErrInvalidArgument},
		"sub-ms retention":   {redisstore.Options{Retention: time.Microsecond}, inbox.ErrInvalidArgument},
		"huge retention":     {redisstore.Options{Retention: redisstore.MaxDuration + 1}, inbox.ErrInvalidArgument},
		"negative lease":     {redisstore.Options{Lease: -time.Second}, inbox.ErrInvalidLease},
		"huge lease":         {redisstore.Options{Lease: redisstore.MaxDuration + 1}, inbox.ErrInvalidLease},
		"over-long prefix":   {redisstore.Options{Prefix: strings.Repeat("p", redisstore.MaxPrefixLen+1)}, inbox.ErrInvalidArgument},
	} {
		if _, err := redisstore.New(c, tc.opts); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if _, err := redisstore.New(nil, redisstore.Options{}); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Errorf("nil client: %v", err)
	}
	if err := (redisstore.Options{}).Validate(); err != nil {
		t.Errorf("zero Options: %v, want valid (defaults)", err)
	}
}

func TestStore_close_keeps_callers_client(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	s := newStore(t, c, redisstore.Options{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryBegin(context.Background(), "k", inbox.BeginOptions{}); !errors.Is(err, inbox.ErrClosed) {
		t.Fatalf("TryBegin after Close: %v, want ErrClosed", err)
	}
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("the caller's client after the store's Close: %v", err)
	}
}

func TestStore_long_lease_is_rejected(t *testing.T) {
	t.Parallel()
	s := newStore(t, sharedClient(t), redisstore.Options{})
	_, err := s.TryBegin(context.Background(), "k", inbox.BeginOptions{Lease: redisstore.MaxDuration + 1})
	if !errors.Is(err, inbox.ErrInvalidLease) {
		t.Fatalf("TryBegin with a lease over MaxDuration: %v, want ErrInvalidLease", err)
	}
	if _, err := s.Extend(context.Background(), "k", inbox.NewLeaseID(), redisstore.MaxDuration+1); !errors.Is(err, inbox.ErrInvalidLease) {
		t.Fatalf("Extend with a lease over MaxDuration: %v, want ErrInvalidLease", err)
	}
}

// A record's physical TTL is lease + retention while in flight and the
// retention once processed; its logical expiry is what the scripts read.
func TestStore_physical_ttl(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Options{Prefix: prefix, Retention: time.Hour})
	cl, err := s.TryBegin(ctx, "k", inbox.BeginOptions{Lease: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ttl := c.PTTL(ctx, prefix+"k").Val()
	if ttl < time.Hour+9*time.Minute || ttl > time.Hour+10*time.Minute+time.Second {
		t.Fatalf("PTTL in flight = %s, want about lease + retention (1h10m)", ttl)
	}
	if err := s.Complete(ctx, "k", cl.LeaseID); err != nil {
		t.Fatal(err)
	}
	ttl = c.PTTL(ctx, prefix+"k").Val()
	if ttl < 59*time.Minute || ttl > time.Hour+time.Second {
		t.Fatalf("PTTL after Complete = %s, want about the retention (1h)", ttl)
	}
}

// Data under the store's prefix that the store did not write is reported,
// never misread or overwritten: a value of another type is a server error
// (WRONGTYPE), a string of another shape an unexpected record; both wrap
// ErrStoreUnavailable and name what was found.
func TestStore_foreign_data_under_prefix(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Options{Prefix: prefix})
	if err := c.HSet(ctx, prefix+"hash", "ex", time.Now().Add(time.Hour).UnixMicro(), "pr", 1).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := s.TryBegin(ctx, "hash", inbox.BeginOptions{})
	if !errors.Is(err, inbox.ErrStoreUnavailable) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("TryBegin over a hash: %v, want ErrStoreUnavailable naming WRONGTYPE", err)
	}
	for _, v := range []string{"x", "\x01\xa1a"} {
		if err := c.Set(ctx, prefix+"string", v, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		_, err = s.TryBegin(ctx, "string", inbox.BeginOptions{})
		if !errors.Is(err, inbox.ErrStoreUnavailable) || !strings.Contains(err.Error(), "unexpected record") {
			t.Fatalf("TryBegin over the string %q: %v, want ErrStoreUnavailable naming the unexpected record", v, err)
		}
		_, err = s.Get(ctx, "string")
		if !errors.Is(err, inbox.ErrStoreUnavailable) || !strings.Contains(err.Error(), "unexpected record") {
			t.Fatalf("Get of the string %q: %v, want ErrStoreUnavailable naming the unexpected record", v, err)
		}
		if got := c.Get(ctx, prefix+"string").Val(); got != v {
			t.Fatalf("the foreign value became %q", got)
		}
	}
}

// Any query either opens a store or fails with ErrInvalidURL (or, when the
// query turns the check at Open back on, ErrStoreUnavailable: nothing
// listens on the port), and no error quotes the password.
func FuzzOpenURL(f *testing.F) {
	for _, q := range []string{"", "prefix=a:&timeout=1s", "cluster=true", "addr=127.0.0.1:2", "dial_timeout=x",
		"retention=1h&lease=2s", "prefix=%zz", "timeout=0", "pool_size=-1", "cluster=1&addr=:1",
		"master_name=m", "master_name=m&addr=127.0.0.1:3&pool_size=3", "master_name=m&route_randomly=1"} {
		f.Add("/0", q)
	}
	f.Fuzz(func(t *testing.T, path, query string) {
		raw := "redis://user:pw-s3cr3t@127.0.0.1:1" + path + "?check=false&" + query
		if _, err := url.Parse(raw); err != nil {
			return // the mux's own parse error, tested in package stores
		}
		s, err := stores.Open(context.Background(), raw)
		if err == nil {
			_ = s.Close()
			return
		}
		if !errors.Is(err, stores.ErrInvalidURL) && !errors.Is(err, inbox.ErrStoreUnavailable) {
			t.Fatalf("Open(%q): %v, want nil, ErrInvalidURL or ErrStoreUnavailable", raw, err)
		}
		if strings.Contains(err.Error(), "pw-s3cr3t") {
			t.Fatalf("Open(%q): error quotes the password: %v", raw, err)
		}
	})
}

// A store opened from a URL skips go-redis's check of every pooled
// connection (conn_check=false, the default): a connection the server
// closed is found dead when used, and go-redis's retry takes a new one, so
// callers see no error once the server is back. conn_check=true restores
// the check, and so does turning go-redis's retries off (max_retries=-1),
// or the first call on each dead connection would fail.
func TestOpenURL_server_restart_with_and_without_conn_check(t *testing.T) {
	t.Parallel()
	for _, q := range []string{"", "conn_check=false", "conn_check=true", "max_retries=-1"} {
		t.Run("query="+q, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, redistest.Config{})
			ctx := context.Background()
			s, err := stores.Open(ctx, "redis://"+srv.Addr()+"/0?timeout=5s&"+q)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			if _, err := s.TryBegin(ctx, "before", inbox.BeginOptions{}); err != nil {
				t.Fatal(err)
			}
			srv.Shutdown()
			srv.Restart()
			for i := range 5 {
				cl, err := s.TryBegin(ctx, fmt.Sprint("after-", i), inbox.BeginOptions{})
				if err != nil || cl.Status != inbox.Acquired {
					t.Fatalf("TryBegin %d after the restart: %+v, %v", i, cl, err)
				}
			}
		})
	}
}
