package redisstore

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox/stores"
)

// Schemes this package registers with
// [github.com/watermill-inbox/inbox/stores]: plain TCP and TLS.
const (
	Scheme    = "redis"
	SchemeTLS = "rediss"
)

// secretParams are the parameters of a Redis URL that carry secrets:
// go-redis's password, the master's password of a Sentinel URL (the user
// info holds the Sentinels' own). They are registered with
// [stores.RegisterSecretParams], so that [stores.Redact] masks them in logs
// and errors.
var secretParams = []string{"password"}

func init() {
	stores.RegisterSecretParams(secretParams...)
	stores.Register(Scheme, stores.OpenerFunc(openURL))
	stores.Register(SchemeTLS, stores.OpenerFunc(openURL))
}

// openURL reads the driver's own parameters (prefix, timeout, conn_check,
// cluster; the mux has taken retention, lease and check) and passes every other one to go-redis, which rejects those it
// does not know by name. master_name makes a Sentinel client (the URL's host
// and any addr are Sentinels), addr or cluster=true a Cluster client, and a
// standalone client otherwise. Unless p.Lazy (check=false), it checks the
// store works before returning it (Store.check).
func openURL(ctx context.Context, u *url.URL, p stores.Params) (stores.Store, error) {
	q := u.Query()
	opts := Options{Retention: p.Retention, Lease: p.Lease}
	var err error
	if opts.Prefix, _, err = stores.PopString(q, "prefix"); err != nil {
		return nil, err
	}
	if opts.Timeout, err = stores.PopDuration(q, "timeout"); err != nil {
		return nil, err
	}
	if v, ok, err := stores.PopString(q, "allow_eviction"); err != nil {
		return nil, err
	} else if ok {
		if opts.AllowEviction, err = strconv.ParseBool(v); err != nil {
			return nil, fmt.Errorf("%w: parameter allow_eviction=%q is not true or false", stores.ErrInvalidURL, v)
		}
	}
	connCheck, connCheckSet := false, false
	if v, ok, err := stores.PopString(q, "conn_check"); err != nil {
		return nil, err
	} else if ok {
		if connCheck, err = strconv.ParseBool(v); err != nil {
			return nil, fmt.Errorf("%w: parameter conn_check=%q is not true or false", stores.ErrInvalidURL, v)
		}
		connCheckSet = true
	}
	protocol := q.Has("protocol")
	sentinel := q.Has("master_name")
	cluster := len(q["addr"]) > 0 && !sentinel // with master_name, addr names more Sentinels
	if v, ok, err := stores.PopString(q, "cluster"); err != nil {
		return nil, err
	} else if ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("%w: parameter cluster=%q is not true or false", stores.ErrInvalidURL, v)
		}
		cluster = cluster || b
	}
	if sentinel {
		if cluster {
			return nil, fmt.Errorf("%w: %s: master_name (Sentinel) and cluster=true exclude each other", stores.ErrInvalidURL, stores.Redact(u))
		}
		if v := q.Get("master_name"); v == "" || len(q["master_name"]) > 1 {
			return nil, fmt.Errorf("%w: %s: parameter master_name must be given once, not empty", stores.ErrInvalidURL, stores.Redact(u))
		}
		// go-redis panics on the first two (they need a cluster-style
		// client), and the third would send the store's writes to replicas.
		for _, n := range []string{"route_by_latency", "route_randomly", "replica_only"} {
			if q.Has(n) {
				return nil, fmt.Errorf("%w: %s: parameter %s is not taken with master_name: the store writes, so it talks to the master only", stores.ErrInvalidURL, stores.Redact(u), n)
			}
		}
	}
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", stores.ErrInvalidURL, stores.Redact(u), err)
	}

	rest := *u
	rest.RawQuery = q.Encode()
	// settings makes the client settings that differ from go-redis's
	// defaults (see "Client settings" in the package
	// documentation), on the fields of whichever options type the URL made.
	settings := func(ctxTimeout *bool, proto *int, dialer *dialFunc, maxRetries int, dial dialFunc) {
		*ctxTimeout = true
		if !protocol {
			*proto = 2
		}
		if !connCheck && (connCheckSet || maxRetries >= 0) {
			*dialer = withoutConnCheck(dial)
		}
	}
	var client redis.UniversalClient
	switch {
	case sentinel:
		fo, err := redis.ParseFailoverURL(rest.String())
		if err != nil {
			return nil, badURL(u, err)
		}
		if err := checkPool(u, fo.PoolSize, fo.MinIdleConns, fo.MaxIdleConns, fo.MaxActiveConns, fo.MaxConcurrentDials); err != nil {
			return nil, err
		}
		settings(&fo.ContextTimeoutEnabled, &fo.Protocol, &fo.Dialer, fo.MaxRetries,
			redis.NewDialer(&redis.Options{DialTimeout: fo.DialTimeout, TLSConfig: fo.TLSConfig}))
		client = redis.NewFailoverClient(fo)
	case cluster:
		if rest.Path != "" && rest.Path != "/" && rest.Path != "/0" {
			return nil, fmt.Errorf("%w: %s: Redis Cluster has only database 0, the URL path names %q", stores.ErrInvalidURL, stores.Redact(u), rest.Path)
		}
		rest.Path = ""
		co, err := redis.ParseClusterURL(rest.String())
		if err != nil {
			return nil, badURL(u, err)
		}
		if err := checkPool(u, co.PoolSize, co.MinIdleConns, co.MaxIdleConns, co.MaxActiveConns, co.MaxConcurrentDials); err != nil {
			return nil, err
		}
		settings(&co.ContextTimeoutEnabled, &co.Protocol, &co.Dialer, co.MaxRetries,
			redis.NewDialer(&redis.Options{DialTimeout: co.DialTimeout, TLSConfig: co.TLSConfig}))
		client = redis.NewClusterClient(co)
	default:
		o, err := redis.ParseURL(rest.String())
		if err != nil {
			return nil, badURL(u, err)
		}
		if err := checkPool(u, o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns, o.MaxConcurrentDials); err != nil {
			return nil, err
		}
		settings(&o.ContextTimeoutEnabled, &o.Protocol, &o.Dialer, o.MaxRetries, redis.NewDialer(o))
		client = redis.NewClient(o)
	}
	s, err := New(client, opts)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	s.d.owns = true
	if !p.Lazy {
		if err := s.check(ctx, u); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	return s, nil
}

// badURL wraps an error of go-redis's URL parser, which names the bad
// parameter but never the password.
func badURL(u *url.URL, err error) error {
	return fmt.Errorf("%w: %s: %v (parameters of this store: retention, lease, check, prefix, timeout, conn_check, cluster, master_name, allow_eviction; any other must be a go-redis option such as dial_timeout or pool_size)",
		stores.ErrInvalidURL, stores.Redact(u), err)
}

// maxPoolParam bounds the pool sizes a URL may ask for.
const maxPoolParam = 100_000

// checkPool rejects pool sizes that go-redis would panic on (negative, found
// by FuzzOpenURL) or allocate without bound (huge), in the order pool_size,
// min_idle_conns, max_idle_conns, max_active_conns, max_concurrent_dials.
func checkPool(u *url.URL, sizes ...int) error {
	names := []string{"pool_size", "min_idle_conns", "max_idle_conns", "max_active_conns", "max_concurrent_dials"}
	for i, n := range sizes {
		if n < 0 || n > maxPoolParam {
			return fmt.Errorf("%w: %s: parameter %s=%d is outside [0, %d]", stores.ErrInvalidURL, stores.Redact(u), names[i], n, maxPoolParam)
		}
	}
	return nil
}

// opaqueConn hides the connection under it (a *net.TCPConn) from go-redis's
// pool, which checks every connection it hands out with a recvfrom
// (MSG_PEEK) system call, but only a connection that exposes its file
// descriptor (syscall.Conn); TLS connections already skip it. See "Clients
// made from a URL" in the package documentation.
type opaqueConn struct{ net.Conn }

// dialFunc is go-redis's Dialer.
type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// withoutConnCheck wraps the connections of dial in opaqueConn.
func withoutConnCheck(dial dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return opaqueConn{c}, nil
	}
}
