package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
)

// Bounds of one page of List (see "Operators: List, Forget, ForceRelease"
// in the package documentation).
const (
	// maxScanSteps bounds the SCAN calls of one page.
	maxScanSteps = 16
	// maxScanCount bounds the COUNT of one SCAN call, which grows while the
	// calls find no key under the prefix.
	maxScanCount = 1000
)

// Forget implements [driver.Driver]: DEL.
func (d *rdb) Forget(ctx context.Context, key string) error {
	return mapErr(d.client.Del(ctx, d.opts.Prefix+key).Err())
}

// ForceRelease implements [driver.Driver]: see forceReleaseScript.
func (d *rdb) ForceRelease(ctx context.Context, key string) error {
	v, err := forceReleaseScript.Run(ctx, d.client, []string{d.opts.Prefix + key}, d.retArgs[0]).Result()
	if err != nil {
		return mapErr(err)
	}
	if v != int64(0) && v != int64(1) {
		return badReply(v)
	}
	return nil
}

// scanNode is a server that List scans: the client's server, or on Cluster
// one of the masters, named by its address.
type scanNode struct {
	addr string
	c    redis.Cmdable
}

// scanNodes returns the servers List scans, in the order it scans them: the
// one server of a standalone or Sentinel client, or every master of a
// Cluster, by address.
func (d *rdb) scanNodes(ctx context.Context) ([]scanNode, error) {
	switch c := d.client.(type) {
	case *redis.Client:
		return []scanNode{{c: c}}, nil
	case *redis.ClusterClient:
		var mu sync.Mutex
		var nodes []scanNode
		err := c.ForEachMaster(ctx, func(_ context.Context, n *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			nodes = append(nodes, scanNode{addr: n.Options().Addr, c: n})
			return nil
		})
		if err != nil {
			return nil, mapErr(err)
		}
		slices.SortFunc(nodes, func(a, b scanNode) int { return cmp.Compare(a.addr, b.addr) })
		return nodes, nil
	}
	return nil, fmt.Errorf("%w: List scans the server of a *redis.Client or the masters of a *redis.ClusterClient, not a %T", inbox.ErrNotSupported, d.client)
}

// listCursor is where a listing stands: the server being scanned and its
// SCAN cursor, or done once every server was scanned; and the keys that
// SCAN returned but the previous page had no room for (without the list
// prefix). See cursor.
type listCursor struct {
	node string // Cluster: the master being scanned; "" otherwise
	scan uint64
	done bool
	rest []string
}

// String encodes c as List's Next: "" at the end of the listing; else
// [node "/"] scan-cursor, or "end" once every server was scanned, then
// each key of rest as ";" length ":" key. Keys are valid UTF-8 without NUL,
// so the cursor is too.
func (c listCursor) String() string {
	if c.done && len(c.rest) == 0 {
		return ""
	}
	var b strings.Builder
	switch {
	case c.done:
		b.WriteString("end")
	case c.node != "":
		b.WriteString(c.node)
		b.WriteByte('/')
		fallthrough
	default:
		b.WriteString(strconv.FormatUint(c.scan, 10))
	}
	for _, k := range c.rest {
		b.WriteByte(';')
		b.WriteString(strconv.Itoa(len(k)))
		b.WriteByte(':')
		b.WriteString(k)
	}
	return b.String()
}

// parseCursor is the inverse of listCursor.String; "" is the start.
func parseCursor(s string) (listCursor, error) {
	var c listCursor
	if s == "" {
		return c, nil
	}
	bad := func() (listCursor, error) {
		return listCursor{}, fmt.Errorf("%w: malformed List cursor %q", inbox.ErrInvalidArgument, s)
	}
	head, tail, more := strings.Cut(s, ";")
	if more && tail == "" {
		return bad()
	}
	if head == "end" {
		c.done = true
	} else {
		if i := strings.LastIndexByte(head, '/'); i >= 0 {
			c.node, head = head[:i], head[i+1:]
			if c.node == "" {
				return bad()
			}
		}
		n, err := strconv.ParseUint(head, 10, 64)
		if err != nil {
			return bad()
		}
		c.scan = n
	}
	for tail != "" {
		l, r, ok := strings.Cut(tail, ":")
		n, err := strconv.Atoi(l)
		if !ok || err != nil || n < 0 || n > len(r) || (n < len(r) && r[n] != ';') {
			return bad()
		}
		c.rest = append(c.rest, r[:n])
		tail = strings.TrimPrefix(r[n:], ";")
		if len(r) > n && tail == "" {
			return bad() // a trailing ";"
		}
	}
	if c.done && len(c.rest) == 0 {
		return bad()
	}
	return c, nil
}

// globEscape escapes the characters of s that are special in a pattern of
// SCAN MATCH.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// List implements [driver.Driver]: SCAN with MATCH on the store's prefix
// and opts.Prefix, then each key's record read in one pipeline, filtered
// and sorted. A page makes at most maxScanSteps SCAN calls, each with COUNT
// the room left on the page (doubling, up to maxScanCount, while the calls
// find no key under the prefix); the keys of a call that do not fit on the
// page travel in Next. On Cluster it scans one master after the other.
func (d *rdb) List(ctx context.Context, opts inbox.ListOptions) (inbox.ListPage, error) {
	cur, err := parseCursor(opts.Cursor)
	if err != nil {
		return inbox.ListPage{}, err
	}
	nodes, err := d.scanNodes(ctx)
	if err != nil {
		return inbox.ListPage{}, err
	}
	pos := 0 // nodes[pos] is being scanned, unless cur.done
	if opts.Cursor != "" && !cur.done {
		if pos = slices.IndexFunc(nodes, func(n scanNode) bool { return n.addr == cur.node }); pos < 0 {
			return inbox.ListPage{}, fmt.Errorf("%w: the List cursor continues the scan of server %q, which List does not scan now (a failover, a change of the Cluster's masters, or a cursor of another client): start the listing again", inbox.ErrInvalidArgument, cur.node)
		}
	}
	match := globEscape(d.opts.Prefix+opts.Prefix) + "*"
	skip := len(d.opts.Prefix) + len(opts.Prefix)
	var items []inbox.ListItem
	steps := 0
	for len(items) < opts.Limit {
		room := opts.Limit - len(items)
		keys := cur.rest // suffixes after opts.Prefix
		cur.rest = nil
		count := max(room-len(keys), 1)
		for len(keys) < room && !cur.done && steps < maxScanSteps {
			need := room - len(keys)
			found, next, err := nodes[pos].c.Scan(ctx, cur.scan, match, int64(count)).Result()
			steps++
			if err != nil {
				return inbox.ListPage{}, mapErr(err)
			}
			if count > need && len(found) > need {
				// A grown COUNT found more keys than the page can take:
				// the same call again with COUNT the room left, so that
				// few keys are left over.
				count = need
				continue
			}
			for _, k := range found {
				// MATCH returns only keys under the prefixes; an empty
				// inbox key is none of the store's.
				if len(k) >= skip && len(k) > len(d.opts.Prefix) {
					keys = append(keys, k[skip:])
				}
			}
			cur.scan = next
			if next == 0 {
				if pos++; pos == len(nodes) {
					cur.done = true
				}
			}
			if len(found) == 0 {
				count = min(2*count, maxScanCount)
			} else {
				count = max(room-len(keys), 1)
			}
		}
		if len(keys) == 0 {
			break
		}
		slices.Sort(keys)
		keys = slices.Compact(keys)
		got, err := d.readList(ctx, opts, keys)
		if err != nil {
			return inbox.ListPage{}, err
		}
		if len(got) > room {
			for _, it := range got[room:] {
				cur.rest = append(cur.rest, it.Key[len(opts.Prefix):])
			}
			got = got[:room]
		}
		items = append(items, got...)
	}
	slices.SortFunc(items, func(a, b inbox.ListItem) int { return strings.Compare(a.Key, b.Key) })
	items = slices.CompactFunc(items, func(a, b inbox.ListItem) bool { return a.Key == b.Key })
	if !cur.done {
		cur.node = nodes[pos].addr
	}
	next := cur.String()
	if len(next) > 4*inbox.MaxKeyLen {
		return inbox.ListPage{}, fmt.Errorf("%w: the %d keys that one SCAN call returned beyond the limit of %d are too long to carry in the List cursor: list with a larger Limit", inbox.ErrInvalidArgument, len(cur.rest), opts.Limit)
	}
	return inbox.ListPage{Items: items, Next: next}, nil
}

// readList reads the records of keys (sorted, after opts.Prefix) in one
// pipeline, and returns those that are live and that opts selects, in key
// order.
func (d *rdb) readList(ctx context.Context, opts inbox.ListOptions, keys []string) ([]inbox.ListItem, error) {
	calls := make([]*scriptCall, len(keys))
	for i, k := range keys {
		calls[i] = &scriptCall{key: opts.Prefix + k}
	}
	p := d.client.Pipeline()
	d.queue(ctx, p, getScript, calls)
	_, _ = p.Exec(ctx) // errors are the commands'
	d.evalNoScript(ctx, getScript, calls)
	var items []inbox.ListItem
	for i, c := range calls {
		v, err := c.cmd.Result()
		if err != nil {
			return nil, mapErr(err)
		}
		r, now, err := getReply(v)
		if err != nil {
			return nil, err
		}
		if r.State == inbox.StateNotFound || (opts.State != inbox.StateNotFound && r.State != opts.State) ||
			r.LastSeen.After(now.Add(-opts.OlderThan)) {
			continue
		}
		items = append(items, inbox.ListItem{Key: opts.Prefix + keys[i], Record: r})
	}
	return items, nil
}
