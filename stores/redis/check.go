package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
)

// checkKey is the inbox key the check at Open reads (never writes): any key
// would do, under the store's prefix so that an ACL limited to it applies.
const checkKey = "stores.Open check"

// check is what [stores.Open] runs on a store it made from u, unless the URL
// says check=false: a PING (the client connects, authenticates and selects
// the database), on a standalone client a look at INFO cluster (a Cluster
// node needs cluster=true), then the Get script on one key under the
// prefix (EVALSHA and EVAL are allowed, the keys readable), then the fast
// claim's commands on that key (SET and PEXPIRETIME allowed, the server
// Redis 7.0 or later). ctx is bounded by the store's Timeout.
func (s *Store) check(ctx context.Context, u *url.URL) error {
	d := s.d
	if t := d.opts.Timeout; t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	target := describeTarget(u)
	if err := d.client.Ping(ctx).Err(); err != nil {
		return checkError(ctx, target, u, "PING", err)
	}
	if c, ok := d.client.(*redis.Client); ok {
		// A standalone client of a Cluster node gets MOVED for the keys of
		// the other nodes' slots: most calls would fail. INFO may be
		// refused by an ACL; that is not the store's business.
		if info, err := c.Info(ctx, "cluster").Result(); err == nil && strings.Contains(info, "cluster_enabled:1") {
			return stores.Misconfigured(fmt.Sprintf("redis store: %s is a Redis Cluster node: add cluster=true to the URL (or addr=... for more seed nodes)", target), nil)
		}
	}
	k := d.opts.Prefix + checkKey
	v, err := getScript.Run(ctx, d.client, []string{k}).Result()
	if err != nil {
		return checkError(ctx, target, u, "the store's scripts (EVALSHA, EVAL) on keys under prefix "+fmt.Sprintf("%q", d.opts.Prefix), err)
	}
	// SET ... XX writes only a key that exists, and the Get script just
	// found none live here: at most it replaces a record past its expiry.
	// The server checks the ACL (and knows PEXPIRETIME) before it runs them.
	if a, ok := v.([]any); ok && len(a) == 1 && a[0] == int64(0) {
		if err := d.client.SetXX(ctx, k, "", time.Millisecond).Err(); err != nil && !errors.Is(err, redis.Nil) {
			return checkError(ctx, target, u, "SET on keys under prefix "+fmt.Sprintf("%q", d.opts.Prefix), err)
		}
	}
	if err := d.client.PExpireTime(ctx, k).Err(); err != nil {
		return checkError(ctx, target, u, "PEXPIRETIME (Redis 7.0 or later) on keys under prefix "+fmt.Sprintf("%q", d.opts.Prefix), err)
	}
	return s.checkEviction(ctx, target, u)
}

// checkEviction reads the maxmemory-policy of the server (of every master
// on Cluster) and refuses one that can evict the store's keys, unless
// Options.AllowEviction. A server that refuses CONFIG GET (an ACL, a
// renamed command, a managed service) gets one warning, and the store
// opens.
func (s *Store) checkEviction(ctx context.Context, target string, u *url.URL) error {
	policy := func(ctx context.Context, c redis.Cmdable) (string, error) {
		m, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			return "", err
		}
		return m["maxmemory-policy"], nil
	}
	var policies []string
	var err error
	if cc, ok := s.d.client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			p, err := policy(ctx, n)
			mu.Lock()
			policies = append(policies, p)
			mu.Unlock()
			return err
		})
	} else {
		var p string
		p, err = policy(ctx, s.d.client)
		policies = append(policies, p)
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		warn(fmt.Sprintf("redis store: %s refused CONFIG GET maxmemory-policy: the store cannot tell whether the server evicts its keys; set maxmemory-policy noeviction on it", target),
			watermill.LogFields{"error": err.Error()})
		return nil
	}
	if err != nil {
		return checkError(ctx, target, u, "CONFIG GET maxmemory-policy", err)
	}
	for _, p := range policies {
		if p == "" {
			warn(fmt.Sprintf("redis store: %s answered CONFIG GET maxmemory-policy with nothing: the store cannot tell whether the server evicts its keys", target), nil)
			return nil
		}
		if p != "noeviction" && !s.d.opts.AllowEviction {
			return stores.Misconfigured(fmt.Sprintf("redis store: %s has maxmemory-policy %s, which can evict the store's keys (every record has a TTL) when memory runs out, and a processed key evicted runs again: set maxmemory-policy noeviction on the server, or add allow_eviction=true to the URL to accept it", target, p),
				fmt.Errorf("%w: %s", ErrEvictionPolicy, p))
		}
	}
	return nil
}

// describeTarget names the server of u for messages: its host, and the kind
// of client.
func describeTarget(u *url.URL) string {
	q := u.Query()
	switch {
	case q.Has("master_name"):
		return fmt.Sprintf("master %q of the Sentinels at %s", q.Get("master_name"), u.Host)
	case len(q["addr"]) > 0:
		return "the Cluster at " + strings.Join(append([]string{u.Host}, q["addr"]...), ",")
	}
	return u.Host
}

// checkError turns the error of the check's step what into the error of
// Open: a mistake of configuration wraps stores.ErrMisconfigured (and
// inbox.ErrStoreUnavailable), anything else inbox.ErrStoreUnavailable only.
// go-redis's messages quote no password.
func checkError(ctx context.Context, target string, u *url.URL, what string, err error) error {
	user := "default"
	if u.User != nil && u.User.Username() != "" {
		user = u.User.Username()
	}
	sentinel := u.Query().Has("master_name")
	var certErr *tls.CertificateVerificationError
	var recordErr tls.RecordHeaderError
	switch {
	case redis.IsLoadingError(err) || redis.IsClusterDownError(err) || redis.IsTryAgainError(err) ||
		redis.IsMasterDownError(err) || redis.IsMaxClientsError(err) || redis.HasErrorPrefix(err, "BUSY"):
		return fmt.Errorf("redis store: Open: %s is not ready (%s): %w: %w; check=false in the URL opens without this check",
			target, what, inbox.ErrStoreUnavailable, err)
	case errors.As(err, &certErr):
		return stores.Misconfigured(fmt.Sprintf("redis store: the TLS certificate of %s is not trusted: give the client the CA that signed it, connect by the name the certificate holds, or skip_verify=true (tests only)", target), err)
	case errors.As(err, &recordErr):
		return stores.Misconfigured(fmt.Sprintf("redis store: %s does not answer in TLS: write redis:// instead of rediss://, or point the URL at the server's TLS port", target), err)
	case redis.IsAuthError(err) || redis.HasErrorPrefix(err, "invalid password") || redis.HasErrorPrefix(err, "invalid username-password"):
		how := "check the user and password in the URL"
		if sentinel {
			how = "check the user and password in the URL: its user info is the Sentinels', its username and password parameters the master's"
		}
		return stores.Misconfigured(fmt.Sprintf("redis store: authentication failed for user %s at %s: %s", user, target, how), err)
	case redis.HasErrorPrefix(err, "AUTH") && strings.Contains(err.Error(), "without any password configured"):
		return stores.Misconfigured(fmt.Sprintf("redis store: %s has no password for user %s, but the URL gives one: remove it from the URL, or set one on the server (requirepass)", target, user), err)
	case redis.IsPermissionError(err):
		return stores.Misconfigured(fmt.Sprintf("redis store: user %s may not run %s at %s: grant it in the server's ACL (the store needs EVALSHA, EVAL, PING, SET, PEXPIRETIME and its keys' commands on ~prefix*, and for the operators' List and Forget SCAN and DEL)", user, what, target), err)
	case redis.HasErrorPrefix(err, "DB index is out of range") || redis.HasErrorPrefix(err, "SELECT is not allowed in cluster mode"):
		return stores.Misconfigured(fmt.Sprintf("redis store: the database in the URL's path %q does not exist at %s: use /0 (Cluster has only 0; a standalone server 0 to 15 unless configured otherwise)", u.Path, target), err)
	case redis.IsReadOnlyError(err):
		return stores.Misconfigured(fmt.Sprintf("redis store: %s is a read-only replica: point the URL at the master, or name the master through Sentinel (master_name)", target), err)
	case ctx.Err() != nil:
		if errors.Is(err, ctx.Err()) {
			return fmt.Errorf("redis store: Open: %s did not answer %s in time: %w: %w; is the server up and the address right? check=false in the URL opens without this check",
				target, what, inbox.ErrStoreUnavailable, err)
		}
		return fmt.Errorf("redis store: Open: %s did not answer %s in time: %w: %w (%w); is the server up and the address right? check=false in the URL opens without this check",
			target, what, inbox.ErrStoreUnavailable, ctx.Err(), err)
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		// Any other refusal by the server (a Lua error, an unknown command
		// on a server that is not Redis) is about this store's setup.
		return stores.Misconfigured(fmt.Sprintf("redis store: %s refused %s", target, what), err)
	}
	return fmt.Errorf("redis store: Open: cannot reach %s: %w: %w; is the server up and the address right? check=false in the URL opens without this check",
		target, inbox.ErrStoreUnavailable, err)
}
