package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	inboxkafka "github.com/watermill-inbox/inbox/kafka"
	"github.com/watermill-inbox/inbox/keying"
	inboxmw "github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/driver"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// The failures section: the inbox on Redis with its broker's
// redelivery (inboxmw.Config.Redelivery: RabbitMQ delay queues, Kafka
// retry topics), on RabbitMQ with failuresRabbitConsumers competing
// consumers and on Kafka with failuresKafkaPartitions partitions, with
// handlers that never fail, that fail at random at the rate failureRate
// (exactly that share of the keys at their first attempt, each later
// attempt with that probability: firstFailures), and that do so with as
// many always-failing (poison) keys as consumers besides; and, at a size
// of its own, the same random failures without Redelivery (the
// backoff waited out in the consumer) against a failure-free trial of
// that size.
const (
	failuresRabbitConsumers = 4
	failuresKafkaPartitions = 16
	failureRate             = 0.1
	// poisonMaxAttempts is MaxAttempts of the variant with poison keys.
	poisonMaxAttempts = 3
	// failuresTrialTimeout is the least bound on a failures trial: a key
	// that fails five times in a row waits out backoffs of up to 2, 4, 8,
	// 16 and 32 s, each rounded up to the broker's ladder.
	failuresTrialTimeout = 5 * time.Minute
	// failuresShare is the share of a trial's keys whose end the first
	// throughput figure waits for.
	failuresShare = 0.9
)

// A failureVariant is how a failures trial's handler fails and what the
// middleware does with a failed attempt.
type failureVariant struct {
	name string
	// rate is the share of the keys whose first attempt fails, and the
	// probability that a later attempt fails (transient, before the
	// handler's effect).
	rate float64
	// poison adds as many always-failing keys as consumers, and sets
	// MaxAttempts to poisonMaxAttempts.
	poison bool
	// inProcess leaves Config.Redelivery unset: a failed attempt's backoff
	// is waited out in the consumer. Such variants run in
	// a group of their own, at -failures-inprocess-n.
	inProcess bool
	// floor runs the hand-off floor (handoff.go) instead of the inbox: no
	// store, every failed attempt handed to the broker's redelivery.
	floor bool
	// order sets Config.OrderKey to inboxkafka.OrderByRecordKey (the order
	// section, order.go).
	order bool
}

// failuresBaseline is the variant without failures, every group's
// baseline.
const failuresBaseline = "no-failures"

func failureVariants() []failureVariant {
	return []failureVariant{
		{name: failuresBaseline},
		{name: "failures-10%", rate: failureRate},
		{name: "failures-10%+poison", rate: failureRate, poison: true},
		{name: "failures-10%-in-process", rate: failureRate, inProcess: true},
		{name: floorBaseline, floor: true},
		{name: "floor-failures-10%", rate: failureRate, floor: true},
	}
}

func failureVariantNames() string {
	var names []string
	for _, v := range failureVariants() {
		names = append(names, v.name)
	}
	return strings.Join(names, ", ")
}

// A failGroup is one broker at one size: its variants are compared with its
// baseline of the same repetition. The in-process group holds the baseline
// and the in-process variants, at their own size.
type failGroup struct {
	broker    string
	consumers int
	n         int // keys per trial (poison keys besides)
	inProcess bool
	variants  []failureVariant
	// orderKeys, for the order section, spreads the n keys (messages) over
	// that many ordering keys, each published with its ordering key as the
	// Kafka record key, to one partition, in order (failProbe.messages);
	// 0: none.
	orderKeys int
	// store is the inbox's store: "redis" (or ""), "postgres" or
	// "memory" (a new one per trial).
	store string
	// cut ends a trial at its timeout once it passed the 90 % point,
	// counting the keys not processed by then (failTrial.unfinished),
	// instead of failing it.
	cut bool
}

type failuresResults struct {
	groups []failGroup
	// trials[group index][variant][rep]
	trials  []map[string][]failTrial
	reps    int
	backoff time.Duration // -failures-backoff
	// retryPartitions is -failures-retry-partitions: RetryConfig.Partitions
	// of the Kafka retry topics, 0 for its default.
	retryPartitions int
}

// failTrial is one failures trial.
type failTrial struct {
	keys, poison int
	// floor: the hand-off floor's trial, which makes no store calls.
	floor bool
	// t90 and tAll: from the first delivery until failuresShare of the keys,
	// and all of them, were processed (the handler's effect applied, or the
	// key dead: its DeadError acked by the poison queue's stand-in).
	t90, tAll time.Duration
	// pass is the time from the first delivery until every key's handler
	// had run once (the first pass over the keys), and atPass the keys
	// processed then.
	pass   time.Duration
	atPass int
	failed int // failed attempts (the handler's injected errors)
	// cpu90 is this process's CPU time from the first delivery until the
	// 90 % point, and redis90 the Redis server's (INFO cpu, read as both
	// points passed; redisMeasured false when a read failed); failed90
	// counts the failed attempts until that point.
	cpu90, redis90 time.Duration
	redisMeasured  bool
	failed90       int
	// batches90: the Redis store's round trips and the calls they
	// carried over the same window (none for the hand-off floor).
	batches90 driver.BatchStats
	// calls are the middleware's store calls by op (Metrics.StoreCall), the
	// hand-offs to the broker (OpRedeliver) among them; outcomes its
	// outcomes; waited its in-process waits (Metrics.Waited).
	calls    map[string]int64
	took     map[string]time.Duration
	outcomes map[inboxmw.Outcome]int64
	waited   time.Duration
	// waits: for each failed attempt after which the key ran again, the
	// time from the handler's failure to its next run; slack, the same
	// less the backoff the store was given for that attempt (Fail's
	// RetryAfter). waitViolations counts the waits shorter than their
	// backoff; unmatched, the failed attempts without a Fail recorded, and
	// Fails without a failed attempt.
	waits, slack   []time.Duration
	waitViolations int
	unmatched      int
	// deadViolations counts the keys that died (the poison keys, and keys
	// whose random failures reached MaxAttempts) not after exactly
	// poisonMaxAttempts attempts spaced by their backoffs (runs, Fails,
	// the store's record), and the poison keys that did not die;
	// randomDead, the keys that died of random failures.
	deadViolations, randomDead int
	// doubled counts keys whose effect was applied more than once.
	doubled int
	// With ordering keys (failGroup.orderKeys): outOfOrder counts the
	// messages applied after a later message of their ordering key,
	// keysOutOfOrder the ordering keys with one or more; behind, the claims
	// the store answered inbox.Behind; lags, for each message applied after
	// an earlier message of its key had a failed attempt, the time from its
	// predecessor's effect to its own. behindDelays are the delays the
	// middleware asked of the broker for the hand-offs of messages waiting
	// behind another (before its ladder rounds them up), and behindMost the
	// most hand-offs of one message that way (inboxmw.MetadataBehind).
	outOfOrder, keysOutOfOrder int
	behind                     int64
	lags                       []time.Duration
	behindDelays               []time.Duration
	behindMost                 int
	// floor90 is when the 90 % point would have come had the first failed
	// message of every key been applied when it was, every later one as
	// soon as that one was, and the others at their first delivery: what
	// waiting out the failed messages' own backoffs costs order, whatever
	// the middleware does with the messages behind them.
	floor90 time.Duration
	// cut, for a trial of a failGroup with cut that reached the 90 % point
	// but not its end within its timeout, is that timeout (tAll is then
	// 0), and unfinished the messages not applied by then.
	cut        time.Duration
	unfinished int
	// unfinishedWhy says, for up to 20 unfinished messages, what they
	// waited for: for the log.
	unfinishedWhy []string
}

func (t failTrial) rate90() float64 {
	return t.keys90() / t.t90.Seconds()
}

func (t failTrial) rateAll() float64 { return float64(t.keys) / t.tAll.Seconds() }

// ratePass is the keys (poison ones too) whose handler first ran, per
// second of the first pass.
func (t failTrial) ratePass() float64 { return float64(t.keys+t.poison) / t.pass.Seconds() }

// keys90 is the keys processed at the 90 % point.
func (t failTrial) keys90() float64 { return float64(need(t.keys, failuresShare)) }

// cpuPerKey90 is this process's CPU time per key until the 90 % point,
// in µs; redisPerKey90 the Redis server's, when measured.
func (t failTrial) cpuPerKey90() (float64, bool) {
	return float64(t.cpu90.Nanoseconds()) / 1e3 / t.keys90(), t.cpu90 > 0
}

func (t failTrial) redisPerKey90() (float64, bool) {
	return float64(t.redis90.Nanoseconds()) / 1e3 / t.keys90(), t.redisMeasured
}

// tripsPerKey90 is the Redis store's round trips per key until the 90 %
// point, and callsPerTrip90 the calls each carried on average.
func (t failTrial) tripsPerKey90() (float64, bool) {
	return float64(t.batches90.RoundTrips) / t.keys90(), t.batches90.RoundTrips > 0
}

func (t failTrial) callsPerTrip90() (float64, bool) {
	if t.batches90.RoundTrips == 0 {
		return 0, false
	}
	return float64(t.batches90.Calls) / float64(t.batches90.RoundTrips), true
}

// handOffs is the hand-offs to the broker per failed attempt.
func (t failTrial) handOffs() (float64, bool) {
	if t.failed == 0 {
		return 0, false
	}
	return float64(t.calls[inboxmw.OpRedeliver]) / float64(t.failed), true
}

// retryCalls is the store calls per failed attempt that retries cost: every
// Fail and Release, and every TryBegin beyond each key's first.
func (t failTrial) retryCalls() (float64, bool) {
	if t.failed == 0 {
		return 0, false
	}
	if t.floor {
		return 0, true
	}
	extra := t.calls[inboxmw.OpTryBegin] - int64(t.keys+t.poison) + t.calls[inboxmw.OpFail] + t.calls[inboxmw.OpRelease]
	return float64(extra) / float64(t.failed), true
}

// meanCall is the mean time of a call of op, in ms.
func (t failTrial) meanCall(op string) (float64, bool) {
	if t.calls[op] == 0 {
		return 0, false
	}
	return float64(t.took[op].Microseconds()) / 1e3 / float64(t.calls[op]), true
}

// need is the number of keys of n that share p of them takes: ceil(p × n).
func need(n int, p float64) int { return int(math.Ceil(p * float64(n))) }

// errInjected is the handler's failure.
var errInjected = errors.New("inboxbench: injected failure")

// unitHash maps (id, attempt) to [0, 1), deterministically: FNV-1a of id,
// mixed with the attempt by SplitMix64's finalizer (FNV alone barely moves
// its high bits when only the last bytes change, and a key that failed once
// would fail again).
func unitHash(id string, attempt int) float64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(id))
	x := h.Sum64() + uint64(attempt+1)*0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}

// keyRuns is what happened to one key in a trial.
type keyRuns struct {
	key        string      // the inbox key (inboxmw.KeyFromCtx)
	runs       []time.Time // each start of the handler
	fails      []time.Time // each failure, when the handler returned it
	ok         int         // effects applied
	dead       bool        // its DeadError reached the stand-in
	poison     bool
	failFirst  bool // its first attempt fails (messages picks them)
	randomDead bool
	// orderKey and seq: the ordering key and the message's place in it
	// (order section); applied, when its effect was first applied.
	orderKey string
	seq      int
	applied  time.Time
	seen     time.Time // its first delivery (order section)
}

// failProbe is a failures trial's handler and the poison queue's stand-in:
// it fails attempts as the variant says, records every run and failure,
// and times the trial.
type failProbe struct {
	v      failureVariant
	n      int // regular keys
	n90    int
	poison int
	// orderKeys: failGroup.orderKeys; first, the regular keys whose first
	// attempt fails (nil: firstFailures picks them).
	orderKeys int
	first     []int

	mu           sync.Mutex
	keys         map[string]*keyRuns // by message UUID
	ended        int                 // regular keys processed or dead
	poisonDead   int
	failed       int
	t0, t90, end time.Time
	started      bool
	// cpu0 and cpu90: this process's CPU time at t0 and t90, failed90 the
	// failed attempts at t90; redis0 and redis90 the Redis server's, read
	// by goroutines of their own (redisRead) so that no handler waits.
	cpu0, cpu90      time.Duration
	failed90         int
	redisCPU         func() (time.Duration, error)
	redisReads       sync.WaitGroup
	redis0, redis90  time.Duration
	redis0E, redis9E error
	// batchStats reads the store's round trips (nil for the floor), at
	// t0 and t90.
	batchStats         func() driver.BatchStats
	batches0, batches9 driver.BatchStats
	// firstRuns counts the keys (poison ones too) whose handler ran at
	// least once; pass is when the last one first ran, and atPass the
	// regular keys processed then.
	firstRuns int
	pass      time.Time
	atPass    int
	done      chan struct{}
	// applied holds, by ordering key, its messages in the order their
	// effects were applied (the first time).
	applied map[string][]*keyRuns
}

// messages makes the trial's messages: the poison ones first (on Kafka,
// one at the head of each partition), then the n regular ones.
//
// With ordering keys, message i (of n) is message i / orderKeys of
// ordering key i % orderKeys: the first message of every ordering key, then
// the second of every one, and so on.
func (p *failProbe) messages(topic string) []*message.Message {
	msgs := benchMessages(topic, p.poison+p.n)
	p.keys = make(map[string]*keyRuns, len(msgs))
	for i, m := range msgs {
		k := &keyRuns{poison: i < p.poison}
		if j := i - p.poison; p.orderKeys > 0 && j >= 0 {
			k.orderKey, k.seq = orderKeyName(j%p.orderKeys), j/p.orderKeys
		}
		p.keys[m.UUID] = k
	}
	first := p.first
	if first == nil {
		first = firstFailures(p.n, p.v.rate)
	}
	for _, i := range first {
		p.keys[msgs[p.poison+i].UUID].failFirst = true
	}
	return msgs
}

// route gives a message of the order section its Kafka record key, its
// ordering key, and its partition: ordering key i on partition i modulo
// the partitions, so that each partition holds as many keys.
func (p *failProbe) route(partitions int) func(*message.Message) (string, int32) {
	return func(m *message.Message) (string, int32) {
		k := p.keys[m.UUID]
		i, _ := strconv.Atoi(strings.TrimPrefix(k.orderKey, orderKeyPrefix))
		return k.orderKey, int32(i % partitions)
	}
}

// firstFailures returns which of n keys fail their first attempt: exactly
// round(rate × n) of them, at random places. An exact count, not a draw
// per key: with a draw, the keys that succeed at once would number
// 0.9 × n give or take √(0.09 × n) (30 of 10,000), and the 90 % point
// would fall in the first pass in one trial and wait for a retried copy,
// at least the shortest delay later, in the next: a coin flip that moved a
// trial's throughput until 90 % up to fourfold.
func firstFailures(n int, rate float64) []int {
	return rand.Perm(n)[:int(math.Round(rate*float64(n)))]
}

// handler fails the attempt (before the effect) when the key is poison, or
// it is the key's first and firstFailures picked the key, or it is a later
// one and the hash of its id and attempt falls under the variant's rate;
// else it applies the effect (counts the key processed).
func (p *failProbe) handler(msg *message.Message) error {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	k := p.keys[msg.UUID]
	if k == nil {
		return fmt.Errorf("inboxbench: message %s is not one of the trial's", msg.UUID)
	}
	if k.key == "" {
		k.key = inboxmw.KeyFromCtx(msg.Context())
	}
	if k.key == "" { // the hand-off floor: no inbox, its records are by UUID
		k.key = msg.UUID
	}
	attempt := len(k.runs)
	k.runs = append(k.runs, now)
	if attempt == 0 {
		if p.firstRuns++; p.firstRuns == len(p.keys) {
			p.pass, p.atPass = now, p.ended
		}
	}
	if k.poison || k.failFirst && attempt == 0 || attempt > 0 && unitHash(msg.UUID, attempt) < p.v.rate {
		k.fails = append(k.fails, time.Now())
		p.failed++
		return errInjected
	}
	if k.ok++; k.ok == 1 {
		k.applied = now
		if k.orderKey != "" {
			if p.applied == nil {
				p.applied = map[string][]*keyRuns{}
			}
			p.applied[k.orderKey] = append(p.applied[k.orderKey], k)
		}
		p.endKey()
	}
	return nil
}

// middleware is the outermost: it notes the first delivery, and stands in
// for a poison queue: a DeadError is the end of its key, acked.
func (p *failProbe) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		p.mu.Lock()
		if !p.started {
			p.started, p.t0, p.cpu0 = true, time.Now(), cpuTime()
			if p.batchStats != nil {
				p.batches0 = p.batchStats()
			}
			p.redisRead(&p.redis0, &p.redis0E)
		}
		if p.orderKeys > 0 {
			if k := p.keys[msg.UUID]; k != nil && k.seen.IsZero() {
				k.seen = time.Now()
			}
		}
		p.mu.Unlock()
		out, err := h(msg)
		var dead *inbox.DeadError
		if !errors.As(err, &dead) {
			return out, err
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if k := p.keys[msg.UUID]; k != nil && !k.dead {
			k.dead = true
			if k.poison {
				p.poisonDead++
				p.check()
			} else {
				k.randomDead = true
				p.endKey()
			}
		}
		return nil, nil
	}
}

// endKey counts a regular key's end; p.mu is held.
func (p *failProbe) endKey() {
	p.ended++
	if p.ended == p.n90 {
		p.t90, p.cpu90, p.failed90 = time.Now(), cpuTime(), p.failed
		if p.batchStats != nil {
			p.batches9 = p.batchStats()
		}
		p.redisRead(&p.redis90, &p.redis9E)
	}
	if p.ended == p.n {
		p.end = time.Now()
	}
	p.check()
}

// redisRead reads the Redis server's CPU time into v (or its error into
// err) in a goroutine of its own; p.mu is held, and the goroutine writes
// under it.
func (p *failProbe) redisRead(v *time.Duration, err *error) {
	if p.redisCPU == nil {
		return
	}
	p.redisReads.Add(1)
	go func() {
		defer p.redisReads.Done()
		d, e := p.redisCPU()
		p.mu.Lock()
		*v, *err = d, e
		p.mu.Unlock()
	}()
}

// check closes done once every regular key ended and every poison key is
// dead; p.mu is held.
func (p *failProbe) check() {
	if p.ended == p.n && p.poisonDead == p.poison && p.done != nil {
		close(p.done)
		p.done = nil
	}
}

// failRecorder is the store of a failures trial: the Redis store (or the
// order section's PostgreSQL or memory store), with every Fail that landed
// recorded by key, in order, and the claims answered Behind counted. It
// embeds the stores' portable layer itself, not an inbox.LeaseStore, so
// that its Go reaches the middleware: the marks then ride the store's
// batching, as in production, instead of a goroutine each; and its
// OrderAdmin, which Config.OrderKey needs. Not being a TxStore, it keeps
// a SQL store in the lease mode.
type failRecorder struct {
	*driver.Store
	mu     sync.Mutex
	fails  map[string][]inbox.FailOptions
	behind int64
}

func (r *failRecorder) TryBegin(ctx context.Context, key string, opts inbox.BeginOptions) (inbox.Claim, error) {
	c, err := r.Store.TryBegin(ctx, key, opts)
	if err == nil && c.Status == inbox.Behind {
		r.mu.Lock()
		r.behind++
		r.mu.Unlock()
	}
	return c, err
}

// The middleware's goer: what makes it send marks without waiting.
var _ interface {
	Go(context.Context, driver.Op, func(inbox.Claim, error))
} = (*failRecorder)(nil)

func (r *failRecorder) Fail(ctx context.Context, key, leaseID string, opts inbox.FailOptions) error {
	err := r.Store.Fail(ctx, key, leaseID, opts)
	if err == nil {
		r.mu.Lock()
		r.fails[key] = append(r.fails[key], opts)
		r.mu.Unlock()
	}
	return err
}

// handOffProbe is the Redeliverer of a trial with the broker's
// redelivery: it records the delays of the hand-offs of messages that wait
// behind an earlier one of their order key, those whose count of such
// hand-offs (inboxmw.MetadataBehind) grew since the message's last
// hand-off (a failed attempt's hand-off carries the count unchanged).
type handOffProbe struct {
	inboxmw.Redeliverer
	mu     sync.Mutex
	last   map[string]int // by message UUID: MetadataBehind at its last hand-off
	delays []time.Duration
	most   int
	// lastAt and lastDelay: by message UUID, when its last hand-off was
	// made, and its delay.
	lastAt    map[string]time.Time
	lastDelay map[string]time.Duration
}

func (h *handOffProbe) Redeliver(ctx context.Context, topic string, msg *message.Message, delay time.Duration) error {
	n, _ := strconv.Atoi(msg.Metadata.Get(inboxmw.MetadataBehind))
	h.mu.Lock()
	if n > h.last[msg.UUID] {
		h.delays = append(h.delays, delay)
		h.most = max(h.most, n)
	}
	h.last[msg.UUID] = n
	h.lastAt[msg.UUID], h.lastDelay[msg.UUID] = time.Now(), delay
	h.mu.Unlock()
	return h.Redeliverer.Redeliver(ctx, topic, msg, delay)
}

// countingMetrics counts the middleware's store calls by op, its outcomes
// and its in-process waits.
type countingMetrics struct {
	mu       sync.Mutex
	calls    map[string]int64
	took     map[string]time.Duration // the calls' time, by op
	outcomes map[inboxmw.Outcome]int64
	waited   time.Duration
}

func newCountingMetrics() *countingMetrics {
	return &countingMetrics{calls: map[string]int64{}, took: map[string]time.Duration{}, outcomes: map[inboxmw.Outcome]int64{}}
}

func (m *countingMetrics) Outcome(_ string, o inboxmw.Outcome) {
	m.mu.Lock()
	m.outcomes[o]++
	m.mu.Unlock()
}

func (m *countingMetrics) StoreCall(op string, d time.Duration, _ error) {
	m.mu.Lock()
	m.calls[op]++
	m.took[op] += d
	m.mu.Unlock()
}

func (m *countingMetrics) Waited(_, _ string, d time.Duration) {
	m.mu.Lock()
	m.waited += d
	m.mu.Unlock()
}

// failuresBackoff is the backoff of the section's inboxes: full jitter up
// to base × 2^attempt, at most a minute; inboxmw.DefaultBackoff at 1 s.
func failuresBackoff(base time.Duration) func(int) time.Duration {
	if base == time.Second {
		return inboxmw.DefaultBackoff
	}
	return inboxmw.ExponentialBackoff(base, time.Minute)
}

// runFailTrial consumes a new queue or topic of g.n keys (and the poison
// keys of v) through the inbox on Redis (or g.store), with the broker's
// redelivery unless v is in-process, and checks the waits and the dead
// keys, and with ordering keys their order. first, when not nil, picks the
// keys whose first attempt fails.
func runFailTrial(ctx context.Context, e *env, b broker, g failGroup, v failureVariant, backoff time.Duration, timeout time.Duration, first []int) (failTrial, error) {
	p := &failProbe{v: v, n: g.n, n90: need(g.n, failuresShare), done: make(chan struct{}), orderKeys: g.orderKeys, first: first}
	ds, closeStore, err := trialStore(e, g.store)
	if err != nil {
		return failTrial{}, err
	}
	defer closeStore()
	if e.redis != nil && ds == e.redisStore.Store {
		p.redisCPU = func() (time.Duration, error) {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return redisCPUTime(rctx, e.redis)
		}
	}
	if v.poison {
		p.poison = g.consumers
	}
	spec := trialSpec{n: g.n + p.poison, consumers: g.consumers, msgs: p.messages, redelivery: !v.inProcess, failures: true}
	if g.orderKeys > 0 {
		spec.route = p.route(g.consumers)
	}
	ts, err := b.prepare(ctx, spec)
	if err != nil {
		return failTrial{}, err
	}
	defer ts.cleanup()
	store := &failRecorder{Store: ds, fails: map[string][]inbox.FailOptions{}}
	if !v.floor {
		p.batchStats = ds.BatchStats
	}
	metrics := newCountingMetrics()
	// The order section's hand-offs go through a probe; the failures
	// section's straight to the broker.
	hands := &handOffProbe{Redeliverer: ts.redelivery, last: map[string]int{}, lastAt: map[string]time.Time{}, lastDelay: map[string]time.Duration{}}
	redelivery := ts.redelivery
	if g.orderKeys > 0 {
		redelivery = hands
	}
	var ib *inboxmw.Inbox
	var floor *handOffFloor
	if v.floor {
		floor = &handOffFloor{redelivery: ts.redelivery, backoff: failuresBackoff(backoff), metrics: metrics, fails: map[string][]inbox.FailOptions{}}
	} else {
		cfg := inboxmw.Config{Store: store, Bus: b.name(), Group: ts.group, Alias: keying.StaticAlias("bench"),
			Backoff: failuresBackoff(backoff), Metrics: metrics}
		if !v.inProcess {
			cfg.Redelivery = redelivery
		}
		if v.poison {
			cfg.MaxAttempts = poisonMaxAttempts
		}
		if v.order {
			cfg.OrderKey = inboxkafka.OrderByRecordKey
		}
		if ib, err = inboxmw.New(cfg); err != nil {
			return failTrial{}, err
		}
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return failTrial{}, err
	}
	if floor != nil {
		router.AddMiddleware(p.middleware, floor.middleware)
	} else {
		router.AddMiddleware(p.middleware, ib.Middleware)
	}
	for i, sub := range ts.subs {
		router.AddConsumerHandler("consumer-"+strconv.Itoa(i), ts.topic, sub, p.handler)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	routerDone := make(chan error, 1)
	go pprof.Do(runCtx, pprof.Labels("variant", v.name, "broker", b.name()), func(ctx context.Context) { routerDone <- router.Run(ctx) })

	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	what := fmt.Sprintf("failures %s/%s", b.name(), v.name)
	var waitErr error
	cut := false
	t := time.NewTimer(timeout)
	select {
	case <-done:
	case <-t.C:
		p.mu.Lock()
		metrics.mu.Lock()
		if g.cut && !p.t90.IsZero() {
			cut = true
		} else {
			waitErr = fmt.Errorf("%s: %d of %d keys processed and %d of %d poison keys dead within %s (%d failed attempts; store calls and hand-offs %v; outcomes %v)",
				what, p.ended, p.n, p.poisonDead, p.poison, timeout, p.failed, metrics.calls, metrics.outcomes)
		}
		metrics.mu.Unlock()
		p.mu.Unlock()
	case err := <-routerDone:
		waitErr = fmt.Errorf("%s: router stopped early: %v", what, err)
	case <-ctx.Done():
		waitErr = ctx.Err()
	}
	t.Stop()
	closeErr := router.Close()
	dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer dcancel()
	if ib != nil {
		if err := ib.Close(dctx); err != nil {
			closeErr = errors.Join(closeErr, fmt.Errorf("draining the inbox: %w", err))
		}
	}
	if err := errors.Join(waitErr, closeErr); err != nil {
		return failTrial{}, err
	}

	p.redisReads.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	metrics.mu.Lock()
	defer metrics.mu.Unlock()
	store.mu.Lock()
	defer store.mu.Unlock()
	fails := store.fails
	if floor != nil {
		floor.mu.Lock()
		defer floor.mu.Unlock()
		fails = floor.fails
	}
	res := failTrial{keys: p.n, poison: p.poison, floor: v.floor, t90: p.t90.Sub(p.t0), tAll: p.end.Sub(p.t0), pass: p.pass.Sub(p.t0), atPass: p.atPass, failed: p.failed,
		calls: metrics.calls, took: metrics.took, outcomes: metrics.outcomes, waited: metrics.waited,
		cpu90: p.cpu90 - p.cpu0, failed90: p.failed90, batches90: p.batches9.Sub(p.batches0), behind: store.behind}
	hands.mu.Lock()
	res.behindDelays, res.behindMost = hands.delays, hands.most
	hands.mu.Unlock()
	if p.redisCPU != nil && p.redis0E == nil && p.redis9E == nil {
		res.redis90, res.redisMeasured = p.redis90-p.redis0, true
	}
	err = p.verify(&res, fails, func(key string) (inbox.Record, error) {
		gctx, gcancel := context.WithTimeout(ctx, 10*time.Second)
		defer gcancel()
		return ds.Get(gctx, key)
	})
	if cut {
		res.tAll, res.cut = 0, timeout
		cutAt := p.t0.Add(timeout) // about: the timer started with the router
		hands.mu.Lock()
		for uuid, k := range p.keys {
			if k.ok > 0 || k.poison || len(res.unfinishedWhy) >= 20 {
				continue
			}
			var before, applied int
			var lastPred time.Time
			for _, o := range p.keys {
				if o.orderKey == k.orderKey && o.seq < k.seq {
					before++
					if o.ok > 0 {
						applied++
						lastPred = later(lastPred, o.applied)
					}
				}
			}
			why := fmt.Sprintf("%s #%d: %d runs, %d of %d earlier messages applied", k.orderKey, k.seq, len(k.runs), applied, before)
			if !lastPred.IsZero() {
				why += fmt.Sprintf(" (the last %s before the cut)", cutAt.Sub(lastPred).Round(time.Second))
			}
			if at, ok := hands.lastAt[uuid]; ok {
				why += fmt.Sprintf("; %d hand-offs behind, the last %s before the cut, for %s", hands.last[uuid], cutAt.Sub(at).Round(time.Second), hands.lastDelay[uuid])
			}
			res.unfinishedWhy = append(res.unfinishedWhy, why)
		}
		hands.mu.Unlock()
	}
	if err == nil && p.orderKeys > 0 {
		err = p.verifyOrder(&res)
	}
	if err != nil {
		return res, fmt.Errorf("%s: %w", what, err)
	}
	return res, nil
}

// trialStore is the store of a failures or order trial (failGroup.store)
// and what closes it: the env's Redis or PostgreSQL store, or a new memory
// store.
func trialStore(e *env, name string) (*driver.Store, func(), error) {
	switch name {
	case "", "redis":
		if e.redisStore == nil {
			return nil, nil, fmt.Errorf("%w: no Redis store in the env", errNoStore)
		}
		return e.redisStore.Store, func() {}, nil
	case "postgres":
		if e.pgStore == nil {
			return nil, nil, fmt.Errorf("%w: no PostgreSQL store in the env", errNoStore)
		}
		return e.pgStore.Store, func() {}, nil
	case "memory":
		s, err := memory.New(memory.Options{Retention: retention})
		if err != nil {
			return nil, nil, err
		}
		return s.Store, func() { _ = s.Close() }, nil
	}
	return nil, nil, fmt.Errorf("%w: %q (known: redis, postgres, memory)", errNoStore, name)
}

// errNoStore: a trial's store is unknown, or its env did not open it.
var errNoStore = errors.New("inboxbench: no such store")

// verifyOrder checks the order section's trial (p's lock held): every
// message applied (else an error: a lost message), and in each ordering
// key the effects in publish order; it counts into res the messages
// applied after a later one of their key and the keys with any, and the
// lags of the messages held behind a failed attempt.
func (p *failProbe) verifyOrder(res *failTrial) error {
	lost := 0
	for _, k := range p.keys {
		if !k.poison && k.ok == 0 {
			lost++
		}
	}
	if res.cut > 0 {
		res.unfinished, lost = lost, 0
	}
	var floors []time.Time
	for _, runs := range p.applied {
		out, maxSeq := 0, -1
		for _, k := range runs {
			if k.seq < maxSeq {
				out++
			}
			maxSeq = max(maxSeq, k.seq)
		}
		res.outOfOrder += out
		if out > 0 {
			res.keysOutOfOrder++
		}
		bySeq := slices.Clone(runs)
		slices.SortFunc(bySeq, func(a, b *keyRuns) int { return a.seq - b.seq })
		held := false
		var head time.Time // when the key's first failed message was applied
		for i, k := range bySeq {
			if i > 0 && held {
				res.lags = append(res.lags, k.applied.Sub(bySeq[i-1].applied))
			}
			if !held && len(k.fails) > 0 {
				held, head = true, k.applied
			}
			floors = append(floors, later(k.seen, head))
		}
	}
	if n := need(p.n, failuresShare); len(floors) >= n && !p.t0.IsZero() {
		slices.SortFunc(floors, func(a, b time.Time) int { return a.Compare(b) })
		res.floor90 = floors[n-1].Sub(p.t0)
	}
	if lost > 0 {
		return fmt.Errorf("%w: %d of %d messages never applied", errLost, lost, p.n)
	}
	return nil
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// errLost: a message of a trial was never applied.
var errLost = errors.New("inboxbench: messages lost")

// verify fills in res's waits and violations from what the handler saw (p,
// whose lock the caller holds), the Fails that landed (fails, by key), and
// the store's records of the dead keys (get).
func (p *failProbe) verify(res *failTrial, fails map[string][]inbox.FailOptions, get func(key string) (inbox.Record, error)) error {
	seen := map[string]bool{}
	for _, k := range p.keys {
		if k.ok > 1 {
			res.doubled++
		}
		fs := fails[k.key]
		if k.key != "" {
			seen[k.key] = true
		}
		res.unmatched += max(len(k.fails)-len(fs), len(fs)-len(k.fails))
		spaced := true
		for i, failedAt := range k.fails {
			if i >= len(fs) || fs[i].Dead || i+1 >= len(k.runs) {
				continue
			}
			wait, backoff := k.runs[i+1].Sub(failedAt), fs[i].RetryAfter
			res.waits = append(res.waits, wait)
			res.slack = append(res.slack, wait-backoff)
			if wait < backoff {
				res.waitViolations++
				spaced = false
			}
		}
		if k.randomDead {
			res.randomDead++
		}
		if !k.poison && !k.dead {
			continue
		}
		ok := k.dead && spaced && len(k.runs) == poisonMaxAttempts && len(k.fails) == poisonMaxAttempts &&
			len(fs) == poisonMaxAttempts && fs[poisonMaxAttempts-1].Dead
		if ok {
			rec, err := get(k.key)
			if err != nil {
				return fmt.Errorf("reading the record of dead key %q: %w", k.key, err)
			}
			ok = rec.State == inbox.StateDead && rec.Attempts == poisonMaxAttempts
		}
		if !ok {
			res.deadViolations++
		}
	}
	for key, fs := range fails {
		if !seen[key] {
			res.unmatched += len(fs) // a Fail of a key whose handler never ran
		}
	}
	return nil
}

func runFailures(ctx context.Context, o options, logf func(string, ...any)) (*failuresResults, error) {
	vs, err := pickFailures(o.failuresVariants)
	if err != nil {
		return nil, err
	}
	res := &failuresResults{reps: o.failuresReps, backoff: o.failuresBackoff, retryPartitions: o.failuresRetryPartitions}
	for _, b := range o.brokers {
		consumers, n, small := failuresRabbitConsumers, o.failuresN, o.failuresInProcessN
		if b == "kafka" {
			consumers, n, small = failuresKafkaPartitions, o.failuresKafkaN, o.failuresKafkaInProcessN
		}
		main := failGroup{broker: b, consumers: consumers, n: n}
		inProc := failGroup{broker: b, consumers: consumers, n: small, inProcess: true}
		for _, v := range vs {
			if v.name == failuresBaseline {
				main.variants = append(main.variants, v)
				inProc.variants = append(inProc.variants, v)
			} else if v.inProcess {
				inProc.variants = append(inProc.variants, v)
			} else {
				main.variants = append(main.variants, v)
			}
		}
		for _, g := range []failGroup{main, inProc} {
			if !g.inProcess || len(g.variants) > 1 {
				res.groups = append(res.groups, g)
				res.trials = append(res.trials, map[string][]failTrial{})
			}
		}
	}
	if len(res.groups) == 0 {
		return res, nil
	}
	e, err := newEnv(ctx, o, map[string]bool{"redis": true}, 0)
	if err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.close(cctx); err != nil {
			logf("cleaning up: %v", err)
		}
	}()
	brokers := map[string]broker{}
	defer func() {
		for _, b := range brokers {
			_ = b.close()
		}
	}()
	for _, g := range res.groups {
		if brokers[g.broker] != nil {
			continue
		}
		var b broker
		switch g.broker {
		case "rabbitmq":
			b, err = newRabbit(o.amqpURL, o.runID+"-f")
		case "kafka":
			var k *kafkaBroker
			if k, err = newKafka(o.kafkaBrokers, o.runID+"-f"); err == nil {
				k.retryPartitions = int32(o.failuresRetryPartitions)
				b = k
			}
		default:
			err = fmt.Errorf("unknown broker %q", g.broker)
		}
		if err != nil {
			return nil, err
		}
		brokers[g.broker] = b
	}
	for rep := range res.reps {
		for gi, g := range res.groups {
			for _, v := range rotate(g.variants, rep+gi) {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				started := time.Now()
				t, err := runFailTrial(ctx, e, brokers[g.broker], g, v, o.failuresBackoff, max(o.trialTimeout, failuresTrialTimeout), nil)
				if err != nil {
					return nil, fmt.Errorf("rep %d: %w", rep+1, err)
				}
				res.trials[gi][v.name] = append(res.trials[gi][v.name], t)
				extra := ""
				if h, ok := t.handOffs(); ok {
					c, _ := t.retryCalls()
					ho, _ := t.meanCall(inboxmw.OpRedeliver)
					extra = fmt.Sprintf("; %d failed attempts, %.2f hand-offs (%.1f ms each) and %.2f store calls each, %d redelivery_failed, waits %s median, slack %s min; violations: %d waits, %d dead keys; %d dead of random failures",
						t.failed, h, ho, c, t.outcomes[inboxmw.OutcomeRedeliveryFailed], durMedian(t.waits).Round(time.Millisecond), durMin(t.slack).Round(time.Millisecond),
						t.waitViolations, t.deadViolations, t.randomDead)
				}
				cpu, _ := t.cpuPerKey90()
				red, _ := t.redisPerKey90()
				logf("rep %d/%d failures %-8s x%-2d %-24s %6d keys: 90%% in %s (%.0f keys/s, cpu %.1f µs/key, redis %.1f), all in %s (%.0f keys/s), first pass in %s (%.1f%% processed)%s  trial %s",
					rep+1, res.reps, g.broker, g.consumers, v.name, t.keys, t.t90.Round(time.Millisecond), t.rate90(), cpu, red, t.tAll.Round(time.Millisecond), t.rateAll(),
					t.pass.Round(time.Millisecond), 100*float64(t.atPass)/float64(t.keys),
					extra, time.Since(started).Round(10*time.Millisecond))
			}
		}
	}
	return res, nil
}

// pickFailures returns the failure variants named, in the order of
// failureVariants; the baseline is always among them, and the hand-off
// floor's with any of its variants.
func pickFailures(names []string) ([]failureVariant, error) {
	base := map[string]bool{failuresBaseline: true}
	for _, n := range names {
		i := slices.IndexFunc(failureVariants(), func(v failureVariant) bool { return v.name == n })
		if i < 0 {
			return nil, fmt.Errorf("unknown failures variant %q (known: %s)", n, failureVariantNames())
		}
		base[baselineOf(failureVariants()[i])] = true
	}
	var out []failureVariant
	for _, v := range failureVariants() {
		if base[v.name] || slices.Contains(names, v.name) {
			out = append(out, v)
		}
	}
	return out, nil
}

// baselineFor is baselineOf the variant named name.
func baselineFor(name string) string {
	for _, v := range failureVariants() {
		if v.name == name {
			return baselineOf(v)
		}
	}
	return failuresBaseline
}

func durMedian(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// durQuantile is the q-quantile of ds (nearest rank).
func durQuantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func durMin(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return slices.Min(ds)
}

// col returns f of variant v's trials in group g, one per repetition; those
// for which f has no figure are left out.
func (r *failuresResults) col(g int, v string, f func(failTrial) (float64, bool)) []float64 {
	var out []float64
	for _, t := range r.trials[g][v] {
		if x, ok := f(t); ok {
			out = append(out, x)
		}
	}
	return out
}

// ratios returns f of v over f of its baseline (baselineOf), per
// repetition.
func (r *failuresResults) ratios(g int, v string, f func(failTrial) float64) []float64 {
	base := r.trials[g][baselineFor(v)]
	var out []float64
	for i, t := range r.trials[g][v] {
		if i < len(base) && f(base[i]) > 0 {
			out = append(out, f(t)/f(base[i]))
		}
	}
	return out
}

// perFailed90 returns, per repetition, what variant v's failed attempts
// until the 90 % point cost over its baseline of the same repetition, in
// µs per failed attempt: the CPU time (this process's and the Redis
// server's; ok false where Redis was not measured) and the wall time
// multiplied by the machine's cores (what the same time of every core
// would hold). Where the first is about the second, the trial was bound by
// CPU; where it is smaller, the failed attempts cost waiting.
func (r *failuresResults) perFailed90(g int, v string) (cpu, wall []float64) {
	base := r.trials[g][baselineFor(v)]
	for i, t := range r.trials[g][v] {
		if i >= len(base) || t.failed90 == 0 || base[i].keys != t.keys {
			continue
		}
		b, n := base[i], float64(t.failed90)
		wall = append(wall, float64((t.t90-b.t90).Nanoseconds())*float64(runtime.NumCPU())/1e3/n)
		if t.redisMeasured && b.redisMeasured {
			cpu = append(cpu, float64((t.cpu90+t.redis90-b.cpu90-b.redis90).Nanoseconds())/1e3/n)
		}
	}
	return cpu, wall
}

// find returns the index of the group of broker (the in-process one when
// inProcess), or -1.
func (r *failuresResults) find(broker string, inProcess bool) int {
	if r == nil {
		return -1
	}
	for i, g := range r.groups {
		if g.broker == broker && g.inProcess == inProcess {
			return i
		}
	}
	return -1
}

// pairRatios is f of variant a over f of the baseline in broker's group,
// per repetition; none when the group or the variant did not run.
func (r *failuresResults) pairRatios(broker string, inProcess bool, a string, f func(failTrial) float64) []float64 {
	g := r.find(broker, inProcess)
	if g < 0 {
		return nil
	}
	if _, ok := r.trials[g][a]; !ok {
		return nil
	}
	return r.ratios(g, a, f)
}

// relativeToFloor is, per repetition of broker's main group, f's ratio of
// failures-10% to no-failures divided by the hand-off floor's
// (floor-failures-10% to floor-no-failures); none when a variant did not
// run.
func (r *failuresResults) relativeToFloor(broker string, f func(failTrial) float64) []float64 {
	inbox := r.pairRatios(broker, false, "failures-10%", f)
	floor := r.pairRatios(broker, false, "floor-failures-10%", f)
	var out []float64
	for i := range min(len(inbox), len(floor)) {
		if floor[i] > 0 {
			out = append(out, inbox[i]/floor[i])
		}
	}
	return out
}

// counts returns f of variant v's trials in broker's main group (and the
// in-process group's, when inProcess), one per repetition: violation
// counters.
func (r *failuresResults) counts(broker string, v string, f func(failTrial) int) []float64 {
	var out []float64
	for _, inProcess := range []bool{false, true} {
		g := r.find(broker, inProcess)
		if g < 0 {
			continue
		}
		for _, t := range r.trials[g][v] {
			out = append(out, float64(f(t)))
		}
	}
	return out
}

func rate90(t failTrial) float64  { return t.rate90() }
func rateAll(t failTrial) float64 { return t.rateAll() }

func ratePass(t failTrial) float64 { return t.ratePass() }

func (r *failuresResults) markdown(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("## Failures: failed attempts held by the broker (issue 21)\n\n")
	p("The inbox on Redis with the broker's redelivery (`inboxmw.Config.Redelivery`: RabbitMQ delay queues, `inboxamqp.Delays`; Kafka retry topics, `inboxkafka.Retry` and its subscriber, %s), the default `RedeliveryMinDelay`, and the backoff %s; RabbitMQ with %d competing consumers (prefetch 1), Kafka with %d partitions. ",
		retryPartitionsName(r.retryPartitions), backoffName(r.backoff), failuresRabbitConsumers, failuresKafkaPartitions)
	p("Variants: `no-failures`, a handler that never fails; `failures-10%%`, a transient error before the handler's effect: exactly 10%% of the keys, picked at random, fail their first attempt, and every later attempt fails with probability 0.1 (decided by a hash of the message UUID and the attempt); `failures-10%%+poison`, the same plus as many always-failing (poison) keys as consumers, published first, with `MaxAttempts: %d` and, for a poison queue, a stand-in that acks a `DeadError` and counts it as its key's end; `failures-10%%-in-process`, the random failures without `Redelivery`: the backoff is waited out in the consumer, as before issue 21; `floor-no-failures` and `floor-failures-10%%`, the hand-off floor (issue 31): the same router, handler and failures with no inbox and no store, which on a failed attempt hands a copy to the same delay queue or retry topic with the same backoff, waits for the same confirm or acknowledged produce, and acks, the copy running the handler again when it comes back: what the broker's hand-off alone costs. Each variant's ratio is to its baseline of the same repetition: `no-failures` for the inbox's, `floor-no-failures` for the floor's; **relative to the hand-off floor** is the inbox's ratio with failures-10%% divided by the floor's, within each repetition: what the inbox adds to a failure (its store calls), the broker's hand-off left out. ", poisonMaxAttempts)
	p("The in-process variant runs at a size of its own, against a `no-failures` trial of that size in the same repetition: its failed keys stall their consumer for their backoff, so at the full size one trial would take minutes. ")
	p("%s of every variant (-failures-reps), each running every variant of a group once in an order rotated from one repetition to the next; ratios are taken within a repetition.\n\n", strings.ToUpper(repetitions(r.reps)[:1])+repetitions(r.reps)[1:])
	p("**Throughput** is keys processed per second (a key is processed when its handler's effect was applied, or when it is dead; the poison keys are not among the trial's keys), from the first delivery: **until 90%% of the trial's keys were processed**, the target's figure, and **until all were** (drain). ")
	p("The backoff's full jitter (up to 2 s after a first failure, 4 s after a second) leaves a tail of waiting keys at the end of every trial with failures, which is the backoff policy's time, not the consumer's: the first figure leaves it out, the second includes it. ")
	p("With failures of 10%%, exactly 90%% of the keys succeed at their first attempt (a count drawn at random instead would put the 90%% point before the first pass's end in one trial and after a retried copy's delay in the next), so the 90%% point comes at the end of the first pass over the keys, or before it when retried copies come back during the pass: the tables also give the first pass, keys whose handler first ran per second until every key's had (poison keys included), and the share of the keys processed at its end. When that share is under 90%%, the 90%% figure waited for retried keys, and holds some of the backoff's time.\n\n")
	p("**Waits**: for each failed attempt after which its key ran again, the time from the handler's failure to the next start of the handler; the backoff is the `RetryAfter` the store's `Fail` got for that attempt. Both ends are taken on the handler's side, outside the store's calls, so a wait shorter than its backoff is one the store and the broker really let through. ")
	p("**Dead keys**: every poison key, and any key whose random failures reached `MaxAttempts`, must be dead after exactly %d attempts (%d runs of the handler, %d `Fail`s, the last one dead, the store's record dead with %d attempts), each run at least its backoff after the previous failure; a violation counts the key. ", poisonMaxAttempts, poisonMaxAttempts, poisonMaxAttempts, poisonMaxAttempts)
	p("**Cost of the retries**, per failed attempt, from a counting `inboxmw.Metrics`: hand-offs to the broker (`Redeliver` calls, op `redeliver`: one broker round trip each, a publish and its confirm, with their mean time), and store calls (every `Fail` and `Release`, and every `TryBegin` beyond each key's first); the mean time of a `Fail`; `redelivery_failed` counts the hand-offs that failed (the message then goes back to the broker as an error); in-process wait is `Metrics.Waited`.\n\n")
	for gi, g := range r.groups {
		unit := map[string]string{"kafka": "partitions", "rabbitmq": "consumers"}[g.broker]
		p("### %s, %d %s, %d keys per trial", g.broker, g.consumers, unit, g.n)
		if g.inProcess {
			p(" (the in-process wait, before issue 21)")
		}
		p("\n\n| variant | keys/s until 90%% processed | ÷ %s | keys/s until all processed (drain) | ÷ %s | first pass: keys first run/s | ÷ %s | processed at the first pass's end, %% | 90%% after s | all after s | first pass after s |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n", "baseline", "baseline", "baseline")
		for _, v := range g.variants {
			r90 := r.col(gi, v.name, func(t failTrial) (float64, bool) { return t.rate90(), true })
			rAll := r.col(gi, v.name, func(t failTrial) (float64, bool) { return t.rateAll(), true })
			q90, qAll := r.ratios(gi, v.name, rate90), r.ratios(gi, v.name, rateAll)
			s90 := r.col(gi, v.name, func(t failTrial) (float64, bool) { return t.t90.Seconds(), true })
			sAll := r.col(gi, v.name, func(t failTrial) (float64, bool) { return t.tAll.Seconds(), true })
			rPass := r.col(gi, v.name, func(t failTrial) (float64, bool) { return t.ratePass(), true })
			qPass := r.ratios(gi, v.name, ratePass)
			atPass := r.col(gi, v.name, func(t failTrial) (float64, bool) { return 100 * float64(t.atPass) / float64(t.keys), true })
			sPass := r.col(gi, v.name, func(t failTrial) (float64, bool) { return t.pass.Seconds(), true })
			p("| %s | %.0f %s | %.2f %s | %.0f %s | %.2f %s | %.0f %s | %.2f %s | %.1f %s | %.2f | %.2f | %.2f |\n", v.name, median(r90), rangeOf(r90, "%.0f"), median(q90), rangeOf(q90, "%.2f"),
				median(rAll), rangeOf(rAll, "%.0f"), median(qAll), rangeOf(qAll, "%.2f"),
				median(rPass), rangeOf(rPass, "%.0f"), median(qPass), rangeOf(qPass, "%.2f"), median(atPass), rangeOf(atPass, "%.1f"),
				median(s90), median(sAll), median(sPass))
		}
		p("\n| variant | failed attempts | hand-offs per failed attempt | hand-off, ms | store calls per failed attempt | Fail, ms | redelivery_failed | in-process wait per failed attempt, ms | wait before the next run: median, ms | p99, ms | min of (wait − backoff), ms | waits shorter than the backoff | dead keys in violation | dead of random failures | effects applied twice | attempts and Fails unpaired |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, v := range g.variants {
			if v.name == baselineOf(v) && len(r.col(gi, v.name, func(t failTrial) (float64, bool) { return float64(t.failed), t.failed > 0 })) == 0 {
				continue // no failed attempt, nothing to say
			}
			var waits, slack []time.Duration
			var sum struct{ rf, wv, dv, rd, dbl, um int }
			for _, t := range r.trials[gi][v.name] {
				waits, slack = append(waits, t.waits...), append(slack, t.slack...)
				sum.rf += int(t.outcomes[inboxmw.OutcomeRedeliveryFailed])
				sum.wv += t.waitViolations
				sum.dv += t.deadViolations
				sum.rd += t.randomDead
				sum.dbl += t.doubled
				sum.um += t.unmatched
			}
			failed := r.col(gi, v.name, func(t failTrial) (float64, bool) { return float64(t.failed), true })
			hand := r.col(gi, v.name, failTrial.handOffs)
			calls := r.col(gi, v.name, failTrial.retryCalls)
			waited := r.col(gi, v.name, func(t failTrial) (float64, bool) {
				if t.failed == 0 {
					return 0, false
				}
				return float64(t.waited.Microseconds()) / 1e3 / float64(t.failed), true
			})
			ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d.Microseconds())/1e3, 'f', 0, 64) }
			minSlack := ""
			if len(slack) > 0 {
				minSlack = ms(durMin(slack))
			}
			handMs := r.col(gi, v.name, func(t failTrial) (float64, bool) { return t.meanCall(inboxmw.OpRedeliver) })
			failMs := r.col(gi, v.name, func(t failTrial) (float64, bool) { return t.meanCall(inboxmw.OpFail) })
			p("| %s | %.0f | %s | %s | %s | %s | %d | %s | %s | %s | %s | %d | %d | %d | %d | %d |\n", v.name, median(failed),
				cell(hand, "%.2f", false), cell(handMs, "%.2f", false), cell(calls, "%.2f", false), cell(failMs, "%.2f", false), sum.rf, cell(waited, "%.0f", false),
				ms(durMedian(waits)), ms(durQuantile(waits, 0.99)), minSlack, sum.wv, sum.dv, sum.rd, sum.dbl, sum.um)
		}
		p("\n| variant | CPU until 90%%: this process, µs/key | Redis server, µs/key | store round trips per key | calls per round trip | failed attempts until 90%% | per failed attempt until 90%%, over its baseline: CPU (process + Redis), µs | wall time × %d cores, µs |\n|---|--:|--:|--:|--:|--:|--:|--:|\n", runtime.NumCPU())
		for _, v := range g.variants {
			cpu := r.col(gi, v.name, failTrial.cpuPerKey90)
			red := r.col(gi, v.name, failTrial.redisPerKey90)
			f90 := r.col(gi, v.name, func(t failTrial) (float64, bool) { return float64(t.failed90), true })
			extra, wall := r.perFailed90(gi, v.name)
			if v.name == baselineOf(v) {
				extra, wall = nil, nil
			}
			trips := r.col(gi, v.name, failTrial.tripsPerKey90)
			per := r.col(gi, v.name, failTrial.callsPerTrip90)
			p("| %s | %s | %s | %s | %s | %.0f | %s | %s |\n", v.name, cell(cpu, "%.1f", false), cell(red, "%.1f", false), cell(trips, "%.2f", false), cell(per, "%.2f", false),
				median(f90), cell(extra, "%.0f", true), cell(wall, "%.0f", true))
		}
		p("\nCPU until 90%% runs from the first delivery to the 90%% point: this process's (getrusage, the broker's side included when it is kfake in this process) and the Redis server's (`INFO cpu`, read as each point passes: the floor uses no store, and its Redis figure is the idle server's); the store's round trips to Redis over the same window (`BatchStats`), per key, and the calls they carried on average. A failed attempt's cost over the baseline of the same repetition, until the 90%% point: the difference of the two trials' CPU, and of their times to the 90%% point multiplied by the cores, over the failed attempts until then. Where the CPU is about the wall time × cores, the failed attempts cost CPU; where it is less, they cost waiting (a partition or consumer held by the store's and the broker's round trips).\n")
		p("\nCounts (redelivery_failed, violations, dead, applied twice, unpaired) are totals over the repetitions; the waits are pooled over them; the other figures are medians of the repetitions. The hand-off floor makes no store calls; its waits are against the backoff it handed off with.\n\n")
		if q := r.relativeToFloor(g.broker, rate90); len(q) > 0 {
			p("Keys processed per second until 90%% were processed, relative to the hand-off floor (failures-10%% ÷ no-failures ÷ (floor-failures-10%% ÷ floor-no-failures)): %s; until all were (drain): %s; in the first pass: %s.\n\n",
				cell(q, "%.2f", true), cell(r.relativeToFloor(g.broker, rateAll), "%.2f", true), cell(r.relativeToFloor(g.broker, ratePass), "%.2f", true))
		}
	}
}

// retryPartitionsName says how many partitions the Kafka retry topics had.
func retryPartitionsName(n int) string {
	if n == 0 {
		return "the default `RetryConfig` (its `Partitions` and `Concurrency`)"
	}
	return fmt.Sprintf("%d partitions per retry topic (-failures-retry-partitions; not the default)", n)
}

// backoffName says which backoff the section used.
func backoffName(base time.Duration) string {
	if base == time.Second {
		return "`inboxmw.DefaultBackoff` (full jitter up to 1 s × 2^attempt, at most 1 min)"
	}
	return fmt.Sprintf("full jitter up to %s × 2^attempt, at most 1 min (-failures-backoff; not the default)", base)
}
