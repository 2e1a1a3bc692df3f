package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
)

// ServerMemory reports the memory of the Redis under the store, from INFO
// memory and INFO stats: evicted, the keys the server has evicted since it
// started (evicted_keys: its keys, the store's or not); used and limit,
// its used_memory and maxmemory in bytes, limit 0 when it has none. On
// Cluster, evicted is the sum over the masters, used and limit those of
// the master with the least room (limit - used). Package inboxmetrics
// exports them (RegisterStore), for an alert on evictions and on memory
// running out. Errors wrap [inbox.ErrStoreUnavailable]; a Ring client is
// [inbox.ErrNotSupported].
func (s *Store) ServerMemory(ctx context.Context) (evicted, used, limit int64, err error) {
	read := func(ctx context.Context, c *redis.Client) (serverMemory, error) {
		info, err := c.Info(ctx, "memory", "stats").Result()
		if err != nil {
			return serverMemory{}, fmt.Errorf("%w: redis store: INFO memory stats: %w", inbox.ErrStoreUnavailable, mapErr(err))
		}
		return parseServerMemory(info)
	}
	switch c := s.d.client.(type) {
	case *redis.Client:
		m, err := read(ctx, c)
		return m.evicted, m.used, m.limit, err
	case *redis.ClusterClient:
		var mu sync.Mutex
		var all serverMemory
		first := true
		err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			m, err := read(ctx, n)
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			all.evicted += m.evicted
			if first || room(m) < room(all) {
				all.used, all.limit = m.used, m.limit
			}
			first = false
			return nil
		})
		return all.evicted, all.used, all.limit, err
	}
	return 0, 0, 0, fmt.Errorf("%w: redis store: ServerMemory needs a *redis.Client or a *redis.ClusterClient, not %T", inbox.ErrNotSupported, s.d.client)
}

// serverMemory is what ServerMemory reads of one server.
type serverMemory struct{ evicted, used, limit int64 }

// room is m's headroom; a server without a limit has the most.
func room(m serverMemory) int64 {
	if m.limit == 0 {
		return 1 << 62
	}
	return m.limit - m.used
}

// parseServerMemory reads evicted_keys, used_memory and maxmemory from the
// text of INFO.
func parseServerMemory(info string) (serverMemory, error) {
	var m serverMemory
	found := 0
	for _, line := range strings.Split(info, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch name {
		case "evicted_keys":
			dst = &m.evicted
		case "used_memory":
			dst = &m.used
		case "maxmemory":
			dst = &m.limit
		default:
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return serverMemory{}, fmt.Errorf("%w: redis store: INFO %s:%q is not an integer", inbox.ErrStoreUnavailable, name, v)
		}
		*dst = n
		found++
	}
	if found != 3 {
		return serverMemory{}, fmt.Errorf("%w: redis store: INFO memory stats lacks evicted_keys, used_memory or maxmemory", inbox.ErrStoreUnavailable)
	}
	return m, nil
}
