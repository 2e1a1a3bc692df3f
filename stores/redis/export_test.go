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
