package inboxkafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
)

// Pauses of the retry consumers, as watermill-kafka's defaults.
const (
	nackResendSleep = 100 * time.Millisecond // before a nacked retry message goes out again
	reconnectSleep  = time.Second            // before joining the retry group again after an error
)

// Subscriber wraps main, the subscriber of RetryConfig.ConsumerGroup on the
// main topics (a watermill-kafka subscriber), for a router handler.
// Subscribe(ctx, topic), for a topic of RetryConfig.Topics, returns one
// channel with main's messages of topic and the messages of topic's retry
// topics, each retry message sent when it is due: until then its retry
// topic's partition waits (as Spring Kafka pauses it), while the main
// topic's partitions and the other retry topics move on. The retry topics
// are consumed in RetryConfig.RetryConsumerGroup, from their oldest offset
// when the group is new. A retry topic's partition sends its messages in
// offset order, each once due, without waiting for the ones before it to be
// acked: up to RetryConfig.Concurrency of them are out at once (the
// router runs each in a goroutine of its own, so retries of one delay are
// not handled one at a time, and not in order). Its offset is committed up
// to its first message not yet acked; a nacked one is sent again after
// 100 ms. A retry message's context holds no watermill-kafka partition,
// offset or key (it would be the retry topic's); its topic, for the
// router, is the main topic.
//
// Close closes main too (a router closes the subscriber it was given), and
// stops the retry consumers: a retry message still waiting for its due time,
// or not yet acked, is neither acked nor committed, and comes back from its
// retry topic to whichever consumer of the retry group reads that partition
// next, with the messages behind it that were acked but not committed (the
// inbox drops those: their keys are processed). A rebalance of the retry
// group does the same to the partitions it moves. [Retry.Close] closes the
// subscribers that were not closed yet.
func (r *Retry) Subscriber(main message.Subscriber) message.Subscriber {
	s := &subscriber{r: r, main: main, closing: make(chan struct{})}
	r.mu.Lock()
	if r.closed {
		s.closed = true
	} else {
		r.subscribers = append(r.subscribers, s)
	}
	r.mu.Unlock()
	return s
}

type subscriber struct {
	r       *Retry
	main    message.Subscriber
	closing chan struct{}

	mu       sync.Mutex
	closed   bool
	running  sync.WaitGroup // one per Subscribe, until its channel is closed
	once     sync.Once
	closeErr error
}

func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	names, known := s.r.retryTopics[topic]
	if !known {
		return nil, fmt.Errorf("%w: inboxkafka: topic %q has no retry topics (it is not in RetryConfig.Topics %v)", inbox.ErrInvalidArgument, topic, s.r.cfg.Topics)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: inboxkafka: subscribing to %q: the subscriber is closed", inbox.ErrClosed, topic)
	}
	s.running.Add(1)
	s.mu.Unlock()
	started := false
	defer func() {
		if !started {
			s.running.Done()
		}
	}()

	cfg := s.r.cfg
	group, err := sarama.NewConsumerGroup(cfg.Brokers, cfg.RetryConsumerGroup, s.r.consumerCfg)
	if err != nil {
		return nil, fmt.Errorf("inboxkafka: connecting the retry consumer group %q to brokers %v: %w", cfg.RetryConsumerGroup, cfg.Brokers, err)
	}
	mainMsgs, err := s.main.Subscribe(ctx, topic)
	if err != nil {
		_ = group.Close()
		return nil, err
	}

	ctx, cancel := context.WithCancel(ctx)
	out := make(chan *message.Message)
	c := &retryConsumer{
		r:   s.r,
		ctx: ctx,
		out: out,
		log: s.r.log.With(watermill.LogFields{"topic": topic}),
	}
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { // the main topic's messages, as they come
		defer wg.Done()
		defer cancel() // main's channel closed: so is this one
		for m := range mainMsgs {
			select {
			case out <- m:
			case <-ctx.Done(): // closing: main's subscriber stops too, unacked
			}
		}
	}()
	go func() {
		defer wg.Done()
		c.run(group, names)
	}()
	go func() {
		defer wg.Done()
		for err := range group.Errors() { // closed by group.Close at the end of run
			c.log.Error("Retry topics' consumer error", err, nil)
		}
	}()
	go func() {
		defer wg.Done()
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	go func() {
		wg.Wait()
		close(out)
		s.running.Done()
	}()
	started = true
	c.log.Info("Subscribed to the retry topics", watermill.LogFields{"retry_topics": fmt.Sprint(names)})
	return out, nil
}

// Close closes main and stops the retry consumers; it returns once every
// channel Subscribe returned is closed.
func (s *subscriber) Close() error {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.closing)
		if err := s.main.Close(); err != nil {
			s.closeErr = fmt.Errorf("inboxkafka: closing the main subscriber: %w", err)
		}
		s.running.Wait()
	})
	return s.closeErr
}

// retryConsumer consumes the retry topics of one main topic in the retry
// consumer group; it is the group's sarama.ConsumerGroupHandler.
type retryConsumer struct {
	r   *Retry
	ctx context.Context // the Subscribe context, cancelled on Close
	out chan<- *message.Message
	log watermill.LoggerAdapter
}

// run joins the group on topics until ctx ends, and closes the group.
func (c *retryConsumer) run(group sarama.ConsumerGroup, topics []string) {
	defer func() {
		if err := group.Close(); err != nil {
			c.log.Info("Closing the retry consumer group failed", watermill.LogFields{"err": err.Error()})
		}
	}()
	for c.ctx.Err() == nil {
		err := group.Consume(c.ctx, topics, c) // returns at a rebalance, to join again
		if err == nil {
			continue
		}
		if errors.Is(err, sarama.ErrClosedConsumerGroup) || c.ctx.Err() != nil {
			return
		}
		c.log.Error("Consuming the retry topics failed; joining the group again in 1 s", err, nil)
		select {
		case <-c.ctx.Done():
		case <-time.After(reconnectSleep):
		}
	}
}

func (*retryConsumer) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (*retryConsumer) Cleanup(sarama.ConsumerGroupSession) error { return nil }

// ConsumeClaim delivers a retry topic's partition until the session ends:
// each message when it is due, in offset order, up to
// RetryConfig.Concurrency of them at once, each on a goroutine of its own
// until it is acked. The partition's offset is committed up to its first
// message not yet acked. It returns once every delivery it started has
// returned, so that none marks an offset after the claim ended.
func (c *retryConsumer) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	p := &partitionAcks{sess: sess, topic: claim.Topic(), partition: claim.Partition(),
		commit: !c.r.consumerCfg.Consumer.Offsets.AutoCommit.Enable}
	slots := make(chan struct{}, c.r.cfg.Concurrency)
	var running sync.WaitGroup
	defer running.Wait()
	done := sess.Context().Done()
	for {
		var km *sarama.ConsumerMessage
		select {
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			km = m
		case <-done:
			return nil
		}
		if !c.hold(sess, km) {
			return nil
		}
		select {
		case slots <- struct{}{}:
		case <-done:
			return nil
		}
		p.start(km.Offset)
		running.Add(1)
		go func() {
			defer running.Done()
			defer func() { <-slots }()
			if c.deliver(sess, km) {
				p.ack(km.Offset)
			}
		}()
	}
}

// hold waits until km is due. It returns false when the session (a
// rebalance, Close) ended first: km is then neither delivered nor marked,
// and the partition's next owner reads it again.
func (c *retryConsumer) hold(sess sarama.ConsumerGroupSession, km *sarama.ConsumerMessage) bool {
	done := sess.Context().Done()
	if sess.Context().Err() != nil {
		return false
	}
	wait := c.wait(km)
	if wait <= 0 {
		return true
	}
	fields := watermill.LogFields{"retry_topic": km.Topic, "kafka_partition": km.Partition, "kafka_partition_offset": km.Offset}
	c.log.Debug("Holding a retry message until it is due", fields.Add(watermill.LogFields{"due_in": wait.String()}))
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		c.log.Debug("Retry message released unacked before it was due: the session ended", fields)
		return false
	}
}

// deliver sends km, which is due, until it is acked, and reports whether it
// was acked within the session. It returns false when the session or the
// subscriber ended first: km is then not marked, and the partition's next
// owner reads it again. A message that cannot be unmarshaled counts as
// acked (skipped, loudly): it would stall the partition's commits for good.
func (c *retryConsumer) deliver(sess sarama.ConsumerGroupSession, km *sarama.ConsumerMessage) bool {
	done := sess.Context().Done()
	fields := watermill.LogFields{"retry_topic": km.Topic, "kafka_partition": km.Partition, "kafka_partition_offset": km.Offset}
	msg, err := c.r.cfg.Unmarshaler.Unmarshal(km)
	if err != nil {
		c.log.Error("Skipping a retry message that cannot be unmarshaled (RetryConfig.Unmarshaler must match Marshaler)", err, fields)
		return true
	}
	delete(msg.Metadata, DueHeader)
	fields = fields.Add(watermill.LogFields{"message_uuid": msg.UUID})
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel() // as watermill-kafka: the message context ends with its delivery
	msg.SetContext(ctx)
	for {
		select {
		case c.out <- msg:
		case <-done:
			return false
		}
		select {
		case <-msg.Acked():
			if sess.Context().Err() != nil {
				c.log.Debug("Retry message acked after its session ended: not committed", fields)
				return false
			}
			return true
		case <-msg.Nacked():
			msg = msg.Copy() // fresh ack channels
			msg.SetContext(ctx)
			t := time.NewTimer(nackResendSleep)
			select {
			case <-t.C:
			case <-done:
				t.Stop()
				return false
			}
		case <-c.ctx.Done(): // Close while the handler runs: leave it unacked
			return false
		}
	}
}

// partitionAcks tracks the messages of one claim that were sent and not yet
// committed, in offset order, and marks the partition's offset up to the
// first one not yet acked: a message acked before one ahead of it waits for
// that one, so that a crash never skips a message that was not acked (it
// re-delivers the acked ones behind it instead, which the inbox drops).
type partitionAcks struct {
	sess      sarama.ConsumerGroupSession
	topic     string
	partition int32
	commit    bool // commit after marking: auto-commit is off

	mu      sync.Mutex
	pending []pendingOffset // increasing offsets; the first not yet acked
}

type pendingOffset struct {
	offset int64
	acked  bool
}

// start records that the message at offset is being delivered; offsets
// come in increasing order.
func (p *partitionAcks) start(offset int64) {
	p.mu.Lock()
	p.pending = append(p.pending, pendingOffset{offset: offset})
	p.mu.Unlock()
}

// ack records that the message at offset was acked, and marks the offset
// past every acked message at the head (commits it when auto-commit is
// off), unless the session has ended.
func (p *partitionAcks) ack(offset int64) {
	p.mu.Lock()
	i, found := slices.BinarySearchFunc(p.pending, offset, func(e pendingOffset, o int64) int { return cmp.Compare(e.offset, o) })
	if !found {
		p.mu.Unlock()
		return
	}
	p.pending[i].acked = true
	n := 0
	for n < len(p.pending) && p.pending[n].acked {
		n++
	}
	if n == 0 {
		p.mu.Unlock()
		return
	}
	next := p.pending[n-1].offset + 1
	p.pending = p.pending[n:]
	marked := p.sess.Context().Err() == nil
	if marked {
		p.sess.MarkOffset(p.topic, p.partition, next, "")
	}
	p.mu.Unlock()
	if marked && p.commit {
		p.sess.Commit()
	}
}

// wait returns how long km has yet to wait: until its DueHeader, or, without
// one, its timestamp plus its retry topic's delay; never longer than that
// delay (a producer whose clock runs ahead).
func (c *retryConsumer) wait(km *sarama.ConsumerMessage) time.Duration {
	delay := c.r.delayOf[km.Topic]
	due := km.Timestamp.Add(delay)
	for i := len(km.Headers) - 1; i >= 0; i-- {
		if h := km.Headers[i]; h != nil && string(h.Key) == DueHeader {
			if ms, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil {
				due = time.UnixMilli(ms)
			}
			break
		}
	}
	return min(time.Until(due), delay)
}
