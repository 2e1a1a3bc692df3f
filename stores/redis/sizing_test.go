package redisstore_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/redis/internal/redistest"
)

// usedMemory is the server's used_memory (INFO memory).
func usedMemory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no used_memory in INFO memory: %q", info)
	return 0
}

// What a processed key costs: 20,000 keys of the shape
// rabbit:billing:orders:<uuid>, claimed and completed with a payload hash
// through stores.Open on a private server, against the floor of the same
// keys written as SET key 1 PX retention, both as used_memory before and
// after. The record of a processed key fits Redis's embedded strings (at
// most 44 bytes), so the inbox costs at most 1.4 times the floor.
func TestSizing_bytes_per_processed_key(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2})
	t.Cleanup(func() { _ = c.Close() })
	const n = 20_000
	const retention = 7 * 24 * time.Hour
	keys := make([]string, n)
	for i := range keys {
		var b [16]byte
		_, _ = rand.Read(b[:])
		h := hex.EncodeToString(b[:])
		keys[i] = "rabbit:billing:orders:" + h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
	}
	st, err := stores.Open(ctx, "redis://"+srv.Addr()+"/0?retention=168h")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ls := st.(inbox.LeaseStore)
	process := func(key string) error {
		sum := sha256.Sum256([]byte("payload of " + key))
		cl, err := ls.TryBegin(ctx, key, inbox.BeginOptions{Owner: "consumer-1", PayloadHash: hex.EncodeToString(sum[:])})
		if err != nil {
			return err
		}
		if cl.Status != inbox.Acquired {
			return fmt.Errorf("TryBegin of %s = %+v", key, cl)
		}
		return ls.Complete(ctx, key, cl.LeaseID)
	}
	// Load the scripts first: their cache is no key's cost.
	if err := process("warm-up"); err != nil {
		t.Fatal(err)
	}
	before := usedMemory(t, c)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				if err := process(keys[i]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	inboxBytes := float64(usedMemory(t, c)-before) / n
	raw, err := c.Get(ctx, "inbox:"+keys[0]).Bytes()
	if err != nil {
		t.Fatal(err)
	}

	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	_ = c.Set(ctx, "warm-up", "1", retention).Err()
	before = usedMemory(t, c)
	p := c.Pipeline()
	for _, k := range keys {
		p.Set(ctx, "inbox:"+k, "1", retention)
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	floor := float64(usedMemory(t, c)-before) / n
	ratio := inboxBytes / floor
	t.Logf("Redis key of %d bytes: %.1f bytes per processed key (value %d bytes), floor (SET key 1 PX) %.1f bytes, ratio %.2f",
		len("inbox:"+keys[0]), inboxBytes, len(raw), floor, ratio)
	if ratio > 1.4 {
		t.Errorf("a processed key costs %.1f bytes, %.2f times the floor of %.1f: want at most 1.4", inboxBytes, ratio, floor)
	}
}
