package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/driver"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// A variant is what sits in the router between the meter and the handler.
type variant struct {
	name  string
	needs string // service of env it needs ("" for none)
	// make returns the middleware for one trial, on bus for group, and what
	// to call after the router has stopped (it drains pending marks).
	make func(e *env, bus, group string) (message.HandlerMiddleware, func(context.Context) error, error)
	// batches, for a variant whose store groups calls into round trips,
	// returns what counts them (the store, or the floor): the tables give
	// the mean calls per round trip of each trial. nil for the others.
	batches func(e *env) batchCounter
}

// batchCounter is any store on the portable layer (stores/driver), and the
// floor: their round trips and the calls those carried.
type batchCounter interface{ BatchStats() driver.BatchStats }

// The baseline: no middleware at all.
const baseline = "none"

func allVariants() []variant {
	return []variant{
		{name: baseline, make: func(*env, string, string) (message.HandlerMiddleware, func(context.Context) error, error) {
			return func(h message.HandlerFunc) message.HandlerFunc { return h }, noClose, nil
		}},
		{name: "deduplicator-memory", make: func(*env, string, string) (message.HandlerMiddleware, func(context.Context) error, error) {
			// Watermill's defaults: Adler-32 of the payload, in-memory
			// repository with a one-minute window. Timeout as the inbox's
			// (a zero Timeout would mean 5 ms, not the documented minute).
			d := &wmw.Deduplicator{Timeout: inboxmw.DefaultStoreTimeout}
			return deduplicator(d), noClose, nil
		}},
		{name: "deduplicator-redis", needs: "redis", make: func(e *env, _, _ string) (message.HandlerMiddleware, func(context.Context) error, error) {
			// One SET NX PX per message (stores/redis ExpiringKeyRepository).
			d := &wmw.Deduplicator{Repository: e.dedupRepo, Timeout: inboxmw.DefaultStoreTimeout}
			return deduplicator(d), noClose, nil
		}},
		floorVariant("floor-redis", "redis", func(e *env) *floor { return e.floor }),
		floorVariant("floor2-redis", "redis", func(e *env) *floor { return e.floor2 }),
		floorVariant("floor2f-redis", "redis", func(e *env) *floor { return e.floor2f }),
		floorVariant("floor2-postgres", "postgres", func(e *env) *floor { return e.pgFloor2 }),
		{name: "store-redis", needs: "redis", make: func(e *env, bus, group string) (message.HandlerMiddleware, func(context.Context) error, error) {
			// Keys as long as the inbox's: bus:group:alias:UUID.
			f := &storeFloor{s: e.redisStore.Store, prefix: bus + ":" + group + ":bench:", owner: inboxmw.DefaultOwner()}
			return f.middleware, f.drain, nil
		}, batches: func(e *env) batchCounter { return e.redisStore }},
		{name: "inbox-memory", make: func(e *env, bus, group string) (message.HandlerMiddleware, func(context.Context) error, error) {
			s, err := memory.New(memory.Options{Retention: retention})
			if err != nil {
				return nil, nil, err
			}
			return inboxMiddleware(s, bus, group, func(ctx context.Context) error { return s.Close() })
		}},
		inboxVariant("inbox-redis", "redis", func(e *env) inbox.LeaseStore { return e.redisStore }, nil),
		inboxVariant("inbox-postgres", "postgres", func(e *env) inbox.LeaseStore { return e.pgStore }, nil),
		inboxVariant("inbox-mariadb", "mariadb", func(e *env) inbox.LeaseStore { return e.myStore }, nil),
		inboxVariant("inbox-sqlite", "sqlite", func(e *env) inbox.LeaseStore { return e.liteStore }, nil),
		// The remote client sends one HTTP request per call (protocol v1 has
		// no batch endpoint); the batching on that path is inboxd's, whose
		// Redis store groups the requests in flight: its round trips to Redis
		// are the ones counted.
		inboxVariant("inbox-remote-redis", "remote", func(e *env) inbox.LeaseStore { return e.remoteStore },
			func(e *env) any { return e.remoteBacking }),
	}
}

func noClose(context.Context) error { return nil }

// floorVariant is the floor that f returns (see floor); its close waits for
// its marks.
func floorVariant(name, needs string, f func(*env) *floor) variant {
	return variant{name: name, needs: needs, make: func(e *env, _, _ string) (message.HandlerMiddleware, func(context.Context) error, error) {
		return f(e).middleware, f(e).drain, nil
	}, batches: func(e *env) batchCounter { return f(e) }}
}

// deduplicator is d's Middleware, one call at a time: Middleware writes its
// defaults into d on every call, and the router calls it for each handler
// (each consumer of the scaling table) concurrently. The lock is taken once
// per handler when the router starts, not per message.
func deduplicator(d *wmw.Deduplicator) message.HandlerMiddleware {
	var mu sync.Mutex
	return func(h message.HandlerFunc) message.HandlerFunc {
		mu.Lock()
		defer mu.Unlock()
		return d.Middleware(h)
	}
}

// usesRedis tells whether v's trials send commands to the shared Redis (the
// remote store's server keeps its records there), so whether Redis's CPU per
// message is reported for it.
func (v variant) usesRedis() bool { return v.needs == "redis" || v.needs == "remote" }

// networked tells whether v's trials reach a store over a socket (Redis,
// PostgreSQL, MariaDB, or the remote store's Redis), which -store-rtt puts
// at a distance; the others (no middleware, the memory stores, SQLite) run
// only at -store-rtt 0, where the distance cannot change them.
func (v variant) networked() bool {
	switch v.needs {
	case "redis", "remote", "postgres", "mariadb":
		return true
	}
	return false
}

// inboxVariant is the inbox on the store that store returns. Its batch
// sizes are those of counted(e), by default the store itself, when that
// implements batchCounter (every store on stores/driver does).
func inboxVariant(name, needs string, store func(*env) inbox.LeaseStore, counted func(*env) any) variant {
	if counted == nil {
		counted = func(e *env) any { return store(e) }
	}
	return variant{name: name, needs: needs, make: func(e *env, bus, group string) (message.HandlerMiddleware, func(context.Context) error, error) {
		return inboxMiddleware(store(e), bus, group, noClose)
	}, batches: func(e *env) batchCounter {
		c, _ := counted(e).(batchCounter)
		return c
	}}
}

// inboxMiddleware is this project's middleware with its defaults, keyed by
// the message UUID under a fixed alias (so that competing handlers of one
// queue share keys, as consumers of one group do).
func inboxMiddleware(s inbox.LeaseStore, bus, group string, after func(context.Context) error) (message.HandlerMiddleware, func(context.Context) error, error) {
	ib, err := inboxmw.New(inboxmw.Config{Store: s, Bus: bus, Group: group, Alias: keying.StaticAlias("bench")})
	if err != nil {
		return nil, nil, err
	}
	return ib.Middleware, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := ib.Close(ctx); err != nil {
			return fmt.Errorf("draining the inbox: %w", err)
		}
		return after(ctx)
	}, nil
}

// variantNames lists the names of every variant, for -h.
func variantNames() string {
	var names []string
	for _, v := range allVariants() {
		names = append(names, v.name)
	}
	return strings.Join(names, ", ")
}

// pick returns the variants named in names, in that order.
// needsOf adds to need the environment vs need (variant.needs).
func needsOf(need map[string]bool, vs []variant) {
	for _, v := range vs {
		need[v.needs] = true
	}
}

func pick(names []string) ([]variant, error) {
	all := allVariants()
	var out []variant
	for _, n := range names {
		found := false
		for _, v := range all {
			if v.name == n {
				out = append(out, v)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown variant %q", n)
		}
	}
	return out, nil
}
