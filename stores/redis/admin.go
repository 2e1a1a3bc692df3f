package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
)

// Bounds of one page of List (see "Operators: List, Forget, ForceRelease"
// in the package documentation).
const (
	// scanCount is the COUNT of each SCAN call.
	scanCount = 1000
	// examineKeys and examineBytes bound the keys one page examines: the
	// smallest keys after the cursor, whose records it reads in key order
	// until the page is full. Without a filter of state or age, nearly
	// every record is selected: a page examines twice the records it
	// holds.
	examineKeys  = 100_000
	examineBytes = 8 << 20
	// maxReadChunk bounds the records read in one pipeline.
	maxReadChunk = 1000
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

// List implements [driver.Driver]: one page in key order. It SCANs the
// whole database (every master on Cluster) with MATCH on the store's prefix
// and opts.Prefix, keeping the smallest keys after the cursor (the last key
// of the previous page), at most examineKeys of them (twice the page's
// records without a filter) and examineBytes of their bytes; then it reads their records with the Get script in key
// order, a pipeline per chunk, until the page holds opts.Limit records
// that opts selects and one more, which tells that another page follows.
// When the kept keys run out first while SCAN found more, the page ends at
// the last key it examined: Next is that key.
func (d *rdb) List(ctx context.Context, opts inbox.ListOptions) (inbox.ListPage, error) {
	nodes, err := d.scanNodes(ctx)
	if err != nil {
		return inbox.ListPage{}, err
	}
	match := globEscape(d.opts.Prefix+opts.Prefix) + "*"
	keep := smallest{maxKeys: examineKeys, maxBytes: examineBytes, set: map[string]struct{}{}}
	if opts.State == inbox.StateNotFound && opts.OlderThan == 0 {
		keep.maxKeys = 2 * (opts.Limit + 1)
	}
	for _, n := range nodes {
		for scan := uint64(0); ; {
			found, next, err := n.c.Scan(ctx, scan, match, scanCount).Result()
			if err != nil {
				return inbox.ListPage{}, mapErr(err)
			}
			for _, k := range found {
				// MATCH returns only keys under the prefixes; an empty
				// inbox key is none of the store's, nor is one with a
				// NUL (an order key's gate).
				if k = k[len(d.opts.Prefix):]; k != "" && k > opts.Cursor && !strings.Contains(k, "\x00") {
					keep.add(k)
				}
			}
			if scan = next; scan == 0 {
				break
			}
		}
	}
	keys := keep.sorted()
	var p inbox.ListPage
	chunk := 0
	for len(keys) > 0 && len(p.Items) <= opts.Limit {
		// What the page still needs, and more after a chunk that filters
		// dropped.
		chunk = min(max(opts.Limit+1-len(p.Items), 2*chunk), maxReadChunk, len(keys))
		got, err := d.readList(ctx, opts, keys[:chunk])
		if err != nil {
			return inbox.ListPage{}, err
		}
		p.Items = append(p.Items, got...)
		keys = keys[chunk:]
	}
	switch {
	case len(p.Items) > opts.Limit:
		p.Items = p.Items[:opts.Limit]
		p.Next = p.Items[opts.Limit-1].Key
	case keep.left:
		p.Next = keep.heap[0] // the largest key examined
	}
	return p, nil
}

// smallest keeps the smallest distinct strings it is given, at most
// maxKeys of them and maxBytes of their bytes, and always the smallest one,
// even longer than maxBytes, so that a page moves on: a max-heap, and the
// set of its strings. Once it has left a string out (left), it keeps only
// those smaller than every string it left out (ceil), so that what it keeps
// is always every string given up to its largest.
type smallest struct {
	maxKeys, maxBytes int
	heap              []string
	set               map[string]struct{}
	bytes             int
	left              bool
	ceil              string
}

func (s *smallest) add(k string) {
	if _, dup := s.set[k]; dup || (s.left && k >= s.ceil) {
		return
	}
	s.heap = append(s.heap, k)
	s.set[k] = struct{}{}
	s.bytes += len(k)
	for i := len(s.heap) - 1; i > 0; {
		p := (i - 1) / 2
		if s.heap[p] >= s.heap[i] {
			break
		}
		s.heap[p], s.heap[i] = s.heap[i], s.heap[p]
		i = p
	}
	for len(s.heap) > s.maxKeys || (s.bytes > s.maxBytes && len(s.heap) > 1) {
		s.left, s.ceil = true, s.heap[0]
		s.pop()
	}
}

// pop removes the largest string.
func (s *smallest) pop() {
	delete(s.set, s.heap[0])
	s.bytes -= len(s.heap[0])
	last := len(s.heap) - 1
	s.heap[0] = s.heap[last]
	s.heap = s.heap[:last]
	for i := 0; ; {
		c := 2*i + 1
		if c >= len(s.heap) {
			return
		}
		if c+1 < len(s.heap) && s.heap[c+1] > s.heap[c] {
			c++
		}
		if s.heap[i] >= s.heap[c] {
			return
		}
		s.heap[i], s.heap[c] = s.heap[c], s.heap[i]
		i = c
	}
}

// sorted returns the strings kept, in increasing order.
func (s *smallest) sorted() []string {
	out := slices.Clone(s.heap)
	slices.Sort(out)
	return out
}

// readList reads the records of keys (inbox keys) in one pipeline, and
// returns those that are live and that opts selects, in the order of keys.
func (d *rdb) readList(ctx context.Context, opts inbox.ListOptions, keys []string) ([]inbox.ListItem, error) {
	calls := make([]*scriptCall, len(keys))
	for i, k := range keys {
		calls[i] = &scriptCall{key: k}
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
		items = append(items, inbox.ListItem{Key: keys[i], Record: r})
	}
	return items, nil
}
