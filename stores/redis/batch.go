package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox/internal/batch"
)

// Batching: the claim of a new key (SET NX PX and PEXPIRETIME), Complete
// and Release go through one group-commit batcher per Store
// (internal/batch): a call that finds fewer than maxInFlight round trips
// in flight goes out at once, alone; calls that arrive while they are in
// flight travel together in the next one, as one pipeline (on Cluster,
// go-redis splits it per node). See "Batched round trips" in the package
// documentation.

// maxBatch bounds the calls of one pipeline; maxQueue the calls waiting.
// maxInFlight is two so that one consumer's claim (on its message's
// critical path) never waits behind the mark of its previous message (in
// the background): with one, such a claim waited for the mark's round trip
// and one consumer on Kafka lost a third of its throughput.
const (
	maxBatch    = 128
	maxQueue    = 4096
	maxInFlight = 2
)

type reqKind uint8

const (
	reqClaim    reqKind = iota // the fast claim of TryBegin
	reqComplete                // the Complete script
	reqRelease                 // the Release script
)

// request is one call carried by the batcher.
type request struct {
	kind    reqKind
	key     string
	leaseID string     // Complete, Release
	fc      *fastClaim // claim: its result is written into fc.expiry
}

func newBatcher(s *Store) *batch.Batcher[*request, any] {
	return batch.New(s.roundTrip, batch.Options{MaxBatch: maxBatch, MaxQueue: maxQueue, MaxInFlight: maxInFlight})
}

// roundTrip sends reqs in one pipeline under ctx and sets each call's raw
// reply and go-redis error (the caller maps them). A script that the
// server does not hold (NOSCRIPT: a restart, SCRIPT FLUSH) is run again on
// its own, which loads it. A connection that fails fails every command of
// the pipeline, hence every call of the batch.
func (s *Store) roundTrip(ctx context.Context, reqs []*request, res []any, errs []error) error {
	type cmds struct {
		set *redis.BoolCmd
		exp *redis.DurationCmd
		cmd *redis.Cmd
	}
	cs := make([]cmds, len(reqs))
	p := s.client.Pipeline()
	for i, r := range reqs {
		switch r.kind {
		case reqClaim:
			cs[i].set, cs[i].exp = r.fc.queue(ctx, p, s.opts.Prefix)
		default:
			cs[i].cmd = script(r.kind).EvalSha(ctx, p, []string{s.opts.Prefix + r.key}, r.leaseID, s.retention, s.retTTL)
		}
	}
	_, _ = p.Exec(ctx)
	for i, r := range reqs {
		if r.kind == reqClaim {
			errs[i] = r.fc.result(cs[i].set, cs[i].exp)
			continue
		}
		c := cs[i].cmd
		if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			c = script(r.kind).Run(ctx, s.client, []string{s.opts.Prefix + r.key}, r.leaseID, s.retention, s.retTTL)
		}
		res[i], errs[i] = c.Result()
	}
	return nil
}

func script(k reqKind) *redis.Script {
	if k == reqRelease {
		return releaseScript
	}
	return completeScript
}

// batched runs a Complete or Release through the batcher under the call's
// timeout and maps its error.
func (s *Store) batched(ctx context.Context, op string, kind reqKind, key, leaseID string) (any, error) {
	cctx, cancel, err := s.begin(ctx, op, key)
	if err != nil {
		return nil, err
	}
	defer cancel()
	v, err := s.batch.Do(cctx, &request{kind: kind, key: key, leaseID: leaseID})
	if err != nil {
		return nil, s.fail(cctx, op, key, err)
	}
	return v, nil
}
