package mongostore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

const (
	// clockResync is how often the store samples the server's clock again.
	clockResync = time.Minute

	// clockSamples is how many samples New takes; the one with the shortest
	// round trip wins.
	clockSamples = 3

	// clockDrift bounds how fast the server's clock and the local monotonic
	// clock may run apart: 500 ppm, the most NTP slews a Linux clock.
	clockDrift = 500e-6
)

// serverClock estimates the server's wall clock from the local monotonic
// clock: now = base + (local() - anchor), where base is the server's time
// (hello's localTime) at the local instant anchor.
type serverClock struct {
	db    *mongo.Database
	local func() time.Time

	synced atomic.Bool // a sample was adopted: base and anchor are set

	mu      sync.Mutex
	base    time.Time     // server time at anchor
	anchor  time.Time     // local instant of the sample
	bound   time.Duration // error bound of the sample when taken
	tried   time.Time     // local instant of the latest sampling
	syncing bool
}

// sample is one reading of the server's clock.
type sample struct {
	base, anchor time.Time
	bound        time.Duration
}

// read asks the server for its time once. The server's localTime has
// millisecond precision and was read somewhere within the round trip, so the
// estimate is the middle of both ranges and its error bound half of each.
func (c *serverClock) read(ctx context.Context) (sample, error) {
	t0 := c.local()
	raw, err := c.db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Raw()
	var se mongo.ServerError
	if errors.As(err, &se) && se.HasErrorCode(59) { // CommandNotFound: a server older than hello
		t0 = c.local()
		raw, err = c.db.RunCommand(ctx, bson.D{{Key: "isMaster", Value: 1}}).Raw()
	}
	t1 := c.local()
	if err != nil {
		return sample{}, err
	}
	lt, ok := raw.Lookup("localTime").TimeOK()
	if !ok {
		return sample{}, errServerClock
	}
	rtt := t1.Sub(t0)
	return sample{
		base:   lt.Add(time.Millisecond / 2),
		anchor: t0.Add(rtt / 2),
		bound:  rtt/2 + time.Millisecond/2,
	}, nil
}

var errServerClock = errors.New("the server's hello reply has no localTime, so its clock cannot be read")

// sync takes n samples and adopts the best one when it beats the current
// estimate (whose bound grows with the drift since it was taken).
func (c *serverClock) sync(ctx context.Context, n int) error {
	var best sample
	for i := range n {
		s, err := c.read(ctx)
		if err != nil {
			return err
		}
		if i == 0 || s.bound < best.bound {
			best = s
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tried = best.anchor
	if c.anchor.IsZero() || best.bound <= c.currentBound(best.anchor) {
		c.base, c.anchor, c.bound = best.base, best.anchor, best.bound
	}
	c.synced.Store(true)
	return nil
}

// currentBound is the error bound of the adopted estimate at local instant
// at. Callers hold c.mu.
func (c *serverClock) currentBound(at time.Time) time.Duration {
	age := at.Sub(c.anchor)
	if age < 0 {
		age = 0
	}
	return c.bound + time.Duration(float64(age)*clockDrift)
}

// now returns the estimated server time, truncated to the millisecond that
// BSON dates keep. Once the estimate is older than clockResync, the first
// caller to notice samples the server again (one round trip); a failed
// resample keeps the old estimate, which stays usable.
func (c *serverClock) now(ctx context.Context) time.Time {
	c.mu.Lock()
	stale := !c.syncing && c.local().Sub(c.tried) >= clockResync
	if stale {
		c.syncing = true
		c.tried = c.local()
	}
	c.mu.Unlock()
	if stale {
		_ = c.sync(ctx, 1) // on failure the call's own operation reports the fault
		c.mu.Lock()
		c.syncing = false
		c.mu.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.base.Add(c.local().Sub(c.anchor)).Truncate(time.Millisecond).UTC()
}

// errorBound reports the error bound of the current estimate and its offset
// from the local wall clock, for logs.
func (c *serverClock) errorBound() (bound, offset time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.local()
	return c.currentBound(now), c.base.Add(now.Sub(c.anchor)).Sub(now.Round(0))
}
