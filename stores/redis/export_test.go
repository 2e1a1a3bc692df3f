package redisstore

import (
	"context"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// The fresh record and the operations script, for the benchmark that sends
// the store's commands through go-redis directly (the overhead of the
// store's Go side is measured against it).
var (
	FreshRecord = freshRecord
	OpsScript   = opsScript
)

// Apply runs ops as one batch of s's driver, as the layer would send them
// together, and returns each one's result and error.
func Apply(ctx context.Context, s *Store, ops []driver.Op) ([]inbox.Claim, []error, error) {
	res, errs := make([]inbox.Claim, len(ops)), make([]error, len(ops))
	err := s.d.Apply(ctx, ops, res, errs)
	return res, errs, err
}

// EncodeCursor and DecodeCursor are List's cursor: the server scanned (on
// Cluster), its SCAN cursor, whether every server was scanned, and the keys
// left over for the next page.
func EncodeCursor(node string, scan uint64, done bool, rest []string) string {
	return listCursor{node: node, scan: scan, done: done, rest: rest}.String()
}

func DecodeCursor(s string) (node string, scan uint64, done bool, rest []string, err error) {
	c, err := parseCursor(s)
	return c.node, c.scan, c.done, c.rest, err
}
