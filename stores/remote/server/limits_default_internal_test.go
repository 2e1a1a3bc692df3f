package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
	_ "github.com/watermill-inbox/inbox/stores/redis" // redis://
)

// The default bound on each token's live records holds on every store,
// not only on memory://: here the shared Redis (a prefix of its own), with
// no limit configured. The bound is lowered to 3 so that the test reaches
// it; a negative MaxRecordsPerToken turns it off. Not parallel: it sets
// the package's default, which parallel tests do not read while it runs.
func TestServer_live_records_are_bounded_by_default_on_redis(t *testing.T) {
	raw := testenv.Redis.URL(t)
	var b [8]byte
	_, _ = rand.Read(b[:])
	prefix := "inboxtest:server-limit:" + hex.EncodeToString(b[:]) + ":"
	o, err := redis.ParseURL(raw)
	if err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(o)
	t.Cleanup(func() {
		ctx := context.Background()
		var keys []string
		it := rc.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for it.Next(ctx) {
			keys = append(keys, it.Val())
		}
		if len(keys) > 0 {
			if err := rc.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("deleting the test keys: %v", err)
			}
		}
		_ = rc.Close()
	})
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("prefix", prefix)
	u.RawQuery = q.Encode()
	s, err := stores.Open(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })

	const token = "tenant-a-token-000000001"
	old := defaultMaxRecordsPerToken
	defaultMaxRecordsPerToken = 3
	t.Cleanup(func() { defaultMaxRecordsPerToken = old })

	tryBegin := func(h http.Handler, key string) (int, string) {
		t.Helper()
		req := httptest.NewRequest("POST", "/v1/inbox/try-begin", strings.NewReader(`{"key":"`+key+`"}`))
		req.Host = "127.0.0.1:8080"
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		var body map[string]any
		_ = json.Unmarshal(w.Body.Bytes(), &body)
		got, _ := body["status"].(string)
		if e, ok := body["error"].(string); ok {
			got = e
		}
		return w.Code, got
	}

	h, err := New(Config{Store: s, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	if h.cfg.MaxRecordsPerToken != 3 {
		t.Fatalf("MaxRecordsPerToken after the defaults: %d, want the default (3 in this test)", h.cfg.MaxRecordsPerToken)
	}
	for i := range 3 {
		if code, status := tryBegin(h, "default:"+strconv.Itoa(i)); code != 200 || status != "Acquired" {
			t.Fatalf("new key %d of 3, within the default bound: %d %s, want 200 Acquired", i, code, status)
		}
	}
	if code, status := tryBegin(h, "default:0"); code != 200 || status != "Busy" {
		t.Fatalf("a key already counted, at the bound: %d %s, want 200 Busy", code, status)
	}
	if code, status := tryBegin(h, "default:3"); code != http.StatusTooManyRequests || status != "quota_exceeded" {
		t.Fatalf("a 4th new key over redis:// with no limit configured: %d %s, want 429 quota_exceeded", code, status)
	}
	if n, err := rc.Exists(context.Background(), prefix+"default:3").Result(); err != nil || n != 0 {
		t.Fatalf("the refused key is in Redis (%d, %v): a refusal must change nothing", n, err)
	}

	off, err := New(Config{Store: s, Token: token, MaxRecordsPerToken: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if code, status := tryBegin(off, "off:"+strconv.Itoa(i)); code != 200 || status != "Acquired" {
			t.Fatalf("new key %d with MaxRecordsPerToken -1 (no bound): %d %s, want 200 Acquired", i, code, status)
		}
	}
}

// The default applies only where the store does not evict: with
// StoreCapacity (a memory:// store's max_entries), the share of the
// capacity applies as before; a configured bound is kept.
func TestConfig_default_max_records_per_token(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in, capacity, want int
	}{{0, 0, DefaultMaxRecordsPerToken}, {0, 100, 0}, {7, 0, 7}, {7, 100, 7}, {-1, 0, -1}} {
		cfg := Config{MaxRecordsPerToken: c.in, StoreCapacity: c.capacity}
		cfg.setDefaults()
		if cfg.MaxRecordsPerToken != c.want {
			t.Errorf("MaxRecordsPerToken %d, StoreCapacity %d: %d after the defaults, want %d", c.in, c.capacity, cfg.MaxRecordsPerToken, c.want)
		}
		if r := newRecords(cfg); c.in < 0 && r != nil {
			t.Errorf("MaxRecordsPerToken %d: the server counts records, want no bound", c.in)
		}
	}
}
