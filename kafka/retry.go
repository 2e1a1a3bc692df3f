package inboxkafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/ladder"
	"github.com/watermill-inbox/inbox/middleware"
)

// DueHeader is the Kafka record header that carries a copy's due time, in
// Unix milliseconds (decimal), on a retry topic. The subscriber that
// [Retry.Subscriber] returns holds the record until then and removes the
// field from the message's metadata.
const DueHeader = "inbox_due"

// RetryConfig configures [NewRetry].
type RetryConfig struct {
	// Brokers lists the Kafka brokers (host:port). Required.
	Brokers []string

	// ConsumerGroup is the consumer group of the subscriber that
	// [Retry.Subscriber] wraps (kafka.SubscriberConfig.ConsumerGroup): the
	// retry topics are this group's own, so two groups on one topic retry
	// their own failures. Required.
	ConsumerGroup string

	// Topics are the main topics whose failed messages are retried: a retry
	// topic per delay is created for each at setup. [Retry.Redeliver] and
	// the wrapped Subscribe refuse other topics. Required.
	Topics []string

	// Delays is the ladder of retry delays, increasing, in whole
	// milliseconds: a retry topic per delay. A copy waits the shortest delay
	// that is at least the wait asked for, or the longest delay when the
	// wait is longer than all of them (the copy then comes back early and
	// the middleware hands it off again for the rest). Default 250 ms,
	// 500 ms, 1 s, 2 s, 5 s, 10 s, 20 s, 30 s, 1 min ([DefaultDelays]).
	Delays []time.Duration

	// SaramaConfig configures the admin client of the setup, the producer of
	// the copies and the consumers of the retry topics. It is copied, never
	// modified. The producer's copy returns successes and errors and waits
	// for RequiredAcks; the consumers' copy reads a retry topic new to the
	// retry consumer group from its oldest offset (a copy published before
	// the group first joined is not skipped) and returns errors (logged).
	// Set Version to what the brokers speak (Kafka 4 needs 2.1 or newer).
	// Default sarama.NewConfig().
	SaramaConfig *sarama.Config

	// RequiredAcks is the acknowledgement a copy's produce waits for before
	// [Retry.Redeliver] returns: sarama.WaitForAll (all in-sync replicas)
	// or sarama.WaitForLocal (the leader). Default (zero) WaitForAll.
	RequiredAcks sarama.RequiredAcks

	// Partitions is the number of partitions of each retry topic created at
	// setup. A partition delivers its due copies concurrently
	// (Concurrency), while each partition costs the retry consumers fetch
	// work and goroutines whether it holds copies or not, so one is the
	// default (BENCHMARKS.md measures it). A partition is read by
	// one member of the retry consumer group at a time: more partitions
	// spread one delay's copies over more consumers. An existing retry
	// topic keeps its partitions. Default [DefaultPartitions].
	Partitions int32

	// Concurrency is the most copies of one retry topic's partition that
	// the subscriber of [Retry.Subscriber] delivers at once: copies that are
	// due, sent to the router, not yet acked. It bounds, with Partitions,
	// how many retries of one delay run at once: with a handler of 100 ms,
	// one partition retries up to Concurrency × 10 copies a second. Default
	// [DefaultConcurrency].
	Concurrency int

	// ReplicationFactor is the replication factor of each retry topic
	// created at setup. Default 0: the main topic's.
	ReplicationFactor int16

	// TopicName names the retry topic of a main topic, consumer group and
	// delay. It must give a valid Kafka topic name, different for every
	// (topic, group, delay) used. Default [DefaultTopicName]:
	// "orders.billing.retry-250ms".
	TopicName func(topic, group string, delay time.Duration) string

	// RetryConsumerGroup is the consumer group that consumes the retry
	// topics: a group of its own, so that joining it does not rebalance the
	// main group. Default ConsumerGroup + ".retry".
	RetryConsumerGroup string

	// Marshaler turns a copy into a Kafka record. Default
	// kafka.DefaultMarshaler (the UUID and metadata as headers).
	Marshaler kafka.Marshaler

	// Unmarshaler turns a retry topic's record back into a message; it must
	// match Marshaler. Default kafka.DefaultMarshaler.
	Unmarshaler kafka.Unmarshaler

	// Logger receives the logs of the setup, the hand-offs and the retry
	// consumers, which never hold payloads. Default watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

// DefaultTopicName is the default of RetryConfig.TopicName:
// "{topic}.{group}.retry-{delay in milliseconds}ms", e.g.
// "orders.billing.retry-250ms". Names can collide when topics or groups
// hold dots ("a.b" and "c" give what "a" and "b.c" give): choose a
// TopicName of your own then.
func DefaultTopicName(topic, group string, delay time.Duration) string {
	return topic + "." + group + ".retry-" + strconv.FormatInt(delay.Milliseconds(), 10) + "ms"
}

// DefaultDelays is the ladder of delays [Retry] uses unless
// RetryConfig.Delays names others, one retry topic each: 250 ms, 500 ms,
// 1 s, 2 s, 5 s, 10 s, 20 s, 30 s and 1 min, as inboxamqp's. It covers
// inboxmw.DefaultBackoff (at most a minute): a copy waits at least its
// backoff and, from 250 ms up, less than 2.5 times it (the step from 2 s
// to 5 s).
var DefaultDelays = ladder.Default

// DefaultConcurrency is the default of RetryConfig.Concurrency.
const DefaultConcurrency = 32

// DefaultPartitions is the default of RetryConfig.Partitions: one
// partition per retry topic.
const DefaultPartitions = 1

// RetryConsumerGroupSuffix is appended to RetryConfig.ConsumerGroup to name
// the retry consumer group when RetryConfig.RetryConsumerGroup is empty.
const RetryConsumerGroupSuffix = ".retry"

func (c *RetryConfig) setDefaults() {
	if len(c.Delays) == 0 {
		c.Delays = DefaultDelays
	}
	if c.SaramaConfig == nil {
		c.SaramaConfig = sarama.NewConfig()
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	if c.RequiredAcks == sarama.NoResponse {
		c.RequiredAcks = sarama.WaitForAll
	}
	if c.TopicName == nil {
		c.TopicName = DefaultTopicName
	}
	if c.RetryConsumerGroup == "" && c.ConsumerGroup != "" {
		c.RetryConsumerGroup = c.ConsumerGroup + RetryConsumerGroupSuffix
	}
	if c.Marshaler == nil {
		c.Marshaler = kafka.DefaultMarshaler{}
	}
	if c.Unmarshaler == nil {
		c.Unmarshaler = kafka.DefaultMarshaler{}
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

// errInvalidConfig is wrapped by the errors of [RetryConfig.Validate].
var errInvalidConfig = fmt.Errorf("%w: invalid inboxkafka.RetryConfig", inbox.ErrInvalidArgument)

// Validate reports every problem of c (its defaults applied), joined, each
// wrapping inbox.ErrInvalidArgument.
func (c RetryConfig) Validate() error {
	c.setDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{errInvalidConfig}, args...)...))
	}
	if len(c.Brokers) == 0 {
		bad("Brokers is required")
	}
	for i, b := range c.Brokers {
		if b == "" {
			bad("Brokers[%d] is empty", i)
		}
	}
	if c.ConsumerGroup == "" {
		bad("ConsumerGroup is required")
	}
	if c.RetryConsumerGroup == c.ConsumerGroup && c.ConsumerGroup != "" {
		bad("RetryConsumerGroup %q is ConsumerGroup: the retry topics need a consumer group of their own", c.RetryConsumerGroup)
	}
	if len(c.Topics) == 0 {
		bad("Topics is required: the main topics to retry")
	}
	if err := ladder.Validate(c.Delays, errInvalidConfig); err != nil {
		errs = append(errs, fmt.Errorf("%w (RetryConfig.Delays)", err))
	}
	if c.RequiredAcks != sarama.WaitForAll && c.RequiredAcks != sarama.WaitForLocal {
		bad("RequiredAcks %d is neither sarama.WaitForAll nor sarama.WaitForLocal", c.RequiredAcks)
	}
	if c.Partitions < 0 {
		bad("Partitions %d is negative", c.Partitions)
	}
	if c.Concurrency < 0 {
		bad("Concurrency %d is negative", c.Concurrency)
	}
	if c.ReplicationFactor < 0 {
		bad("ReplicationFactor %d is negative", c.ReplicationFactor)
	}
	seen := map[string]string{} // topic name -> what it is
	for i, t := range c.Topics {
		if t == "" {
			bad("Topics[%d] is empty", i)
			continue
		}
		if what, dup := seen[t]; dup {
			bad("topic %q is listed twice (%s)", t, what)
			continue
		}
		seen[t] = "a main topic"
	}
	if c.ConsumerGroup != "" && len(errs) == 0 {
		for _, t := range c.Topics {
			for _, d := range c.Delays {
				name := c.TopicName(t, c.ConsumerGroup, d)
				what := fmt.Sprintf("the retry topic of %q, group %q, delay %s", t, c.ConsumerGroup, d)
				if err := validTopicName(name); err != nil {
					bad("%s would be %q, which %v", what, name, err)
				} else if other, dup := seen[name]; dup {
					bad("%s is named %q, as %s is", what, name, other)
				}
				seen[name] = what
			}
		}
	}
	for _, cfg := range []*sarama.Config{c.producerConfig(), c.consumerConfig()} {
		if err := cfg.Validate(); err != nil {
			bad("SaramaConfig: %v", err)
			break
		}
	}
	return errors.Join(errs...)
}

// validTopicName checks what Kafka accepts as a topic name.
func validTopicName(name string) error {
	if name == "" || name == "." || name == ".." {
		return errors.New("is not a valid Kafka topic name")
	}
	if len(name) > 249 {
		return fmt.Errorf("is %d characters long; Kafka allows 249", len(name))
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("holds %q; Kafka topic names hold only ASCII letters, digits, '.', '_' and '-'", r)
		}
	}
	return nil
}

func (c *RetryConfig) producerConfig() *sarama.Config {
	cfg := *c.SaramaConfig
	cfg.Producer.Return.Successes = true
	cfg.Producer.Return.Errors = true
	cfg.Producer.RequiredAcks = c.RequiredAcks
	return &cfg
}

func (c *RetryConfig) consumerConfig() *sarama.Config {
	cfg := *c.SaramaConfig
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Return.Errors = true
	return &cfg
}

// Retry hands failed messages to retry topics, in the manner of Spring
// Kafka's non-blocking retries: it is the [inboxmw.Redeliverer] of
// inboxmw.Config.Redelivery, and its [Retry.Subscriber] delivers the
// retry topics' messages, each when due, with the main topic's. See the
// package documentation.
type Retry struct {
	cfg          RetryConfig
	log          watermill.LoggerAdapter
	consumerCfg  *sarama.Config
	retryTopics  map[string][]string      // main topic -> its retry topics, in Delays order
	delayOf      map[string]time.Duration // retry topic -> its delay
	producer     sarama.SyncProducer
	mu           sync.Mutex
	closed       bool
	sending      sync.WaitGroup // Redeliver's produces in flight
	subscribers  []*subscriber  // those Subscriber made, closed by Close
	producerOnce sync.Once
	producerErr  error
}

var _ inboxmw.Redeliverer = (*Retry)(nil)

// NewRetry validates cfg and sets up its retry topics: it creates, through
// the admin API, those of Topics × Delays that do not exist yet (an
// existing topic is left as it is), checks that the retry consumer group
// can be described, and connects the producer of the copies. A setup that
// cannot reach the brokers, or is not allowed to create or describe what it
// needs, fails here with an error that says which step failed on which
// topic or group. ctx bounds the setup; the Retry does not keep it.
func NewRetry(ctx context.Context, cfg RetryConfig) (*Retry, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Brokers = slices.Clone(cfg.Brokers)
	cfg.Topics = slices.Clone(cfg.Topics)
	cfg.Delays = slices.Clone(cfg.Delays)
	sc := *cfg.SaramaConfig // the caller's stays as it is, whatever sarama does
	cfg.SaramaConfig = &sc
	r := &Retry{
		cfg:         cfg,
		log:         cfg.Logger.With(watermill.LogFields{"consumer_group": cfg.ConsumerGroup, "retry_consumer_group": cfg.RetryConsumerGroup}),
		consumerCfg: cfg.consumerConfig(),
		retryTopics: make(map[string][]string, len(cfg.Topics)),
		delayOf:     make(map[string]time.Duration, len(cfg.Topics)*len(cfg.Delays)),
	}
	for _, t := range cfg.Topics {
		for _, d := range cfg.Delays {
			name := cfg.TopicName(t, cfg.ConsumerGroup, d)
			r.retryTopics[t] = append(r.retryTopics[t], name)
			r.delayOf[name] = d
		}
	}

	type result struct {
		producer sarama.SyncProducer
		err      error
	}
	done := make(chan result, 1)
	go func() {
		p, err := r.setup(ctx)
		done <- result{p, err}
	}()
	select {
	case res := <-done:
		if res.err != nil {
			return nil, res.err
		}
		r.producer = res.producer
		return r, nil
	case <-ctx.Done():
		// A sarama call does not take a context: let it end on its own
		// timeouts, and close what it made.
		go func() {
			if res := <-done; res.producer != nil {
				_ = res.producer.Close()
			}
		}()
		return nil, fmt.Errorf("inboxkafka: setting up the retry topics: %w", ctx.Err())
	}
}

// setup creates the missing retry topics and connects the producer.
func (r *Retry) setup(ctx context.Context) (sarama.SyncProducer, error) {
	brokers := r.cfg.Brokers
	admin, err := sarama.NewClusterAdmin(brokers, r.cfg.SaramaConfig)
	if err != nil {
		return nil, fmt.Errorf("inboxkafka: connecting an admin client to Kafka brokers %v to set up the retry topics: %w", brokers, err)
	}
	defer func() { _ = admin.Close() }()

	mainMeta, err := describe(admin, r.cfg.Topics)
	if err != nil {
		return nil, fmt.Errorf("inboxkafka: describing the main topics %v on brokers %v: %w", r.cfg.Topics, brokers, err)
	}
	var retryNames []string
	for _, t := range r.cfg.Topics {
		retryNames = append(retryNames, r.retryTopics[t]...)
	}
	retryMeta, err := describe(admin, retryNames)
	if err != nil {
		return nil, fmt.Errorf("inboxkafka: describing the retry topics on brokers %v: %w", brokers, err)
	}
	var created []string
	for _, t := range r.cfg.Topics {
		detail := sarama.TopicDetail{NumPartitions: r.cfg.Partitions, ReplicationFactor: r.cfg.ReplicationFactor}
		for _, name := range r.retryTopics[t] {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			switch m := retryMeta[name]; {
			case m != nil && errors.Is(m.Err, sarama.ErrNoError):
				continue // exists: left as it is
			case m != nil && !errors.Is(m.Err, sarama.ErrUnknownTopicOrPartition):
				return nil, fmt.Errorf("inboxkafka: describing retry topic %q on brokers %v: %w", name, brokers, m.Err)
			}
			if detail.ReplicationFactor == 0 {
				mm := mainMeta[t]
				if mm == nil || !errors.Is(mm.Err, sarama.ErrNoError) || len(mm.Partitions) == 0 {
					why := "does not exist"
					if mm != nil && !errors.Is(mm.Err, sarama.ErrNoError) && !errors.Is(mm.Err, sarama.ErrUnknownTopicOrPartition) {
						why = "cannot be described: " + mm.Err.Error()
					}
					return nil, fmt.Errorf("inboxkafka: main topic %q %s on brokers %v, so retry topic %q cannot take its replication factor: create the main topic first, or set RetryConfig.ReplicationFactor",
						t, why, brokers, name)
				}
				detail.ReplicationFactor = int16(max(1, len(mm.Partitions[0].Replicas)))
			}
			err := admin.CreateTopic(name, &detail, false)
			if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
				return nil, fmt.Errorf("inboxkafka: creating retry topic %q (%d partitions, replication factor %d) on brokers %v: %w",
					name, detail.NumPartitions, detail.ReplicationFactor, brokers, err)
			}
			if err == nil {
				created = append(created, name)
				r.log.Info("Created Kafka retry topic", watermill.LogFields{
					"topic": t, "retry_topic": name, "delay": r.delayOf[name].String(),
					"partitions": detail.NumPartitions, "replication_factor": detail.ReplicationFactor,
				})
			}
		}
	}
	if err := waitVisible(ctx, admin, created); err != nil {
		return nil, fmt.Errorf("inboxkafka: waiting for the new retry topics %v to appear on brokers %v: %w", created, brokers, err)
	}

	groups, err := admin.DescribeConsumerGroups([]string{r.cfg.RetryConsumerGroup})
	if err == nil && len(groups) == 1 && !errors.Is(groups[0].Err, sarama.ErrNoError) {
		err = groups[0].Err
	}
	if err != nil {
		return nil, fmt.Errorf("inboxkafka: describing the retry consumer group %q on brokers %v: %w", r.cfg.RetryConsumerGroup, brokers, err)
	}

	producer, err := sarama.NewSyncProducer(brokers, r.cfg.producerConfig())
	if err != nil {
		return nil, fmt.Errorf("inboxkafka: connecting the retry topics' producer to brokers %v: %w", brokers, err)
	}
	return producer, nil
}

// describe returns the metadata of topics by name.
func describe(admin sarama.ClusterAdmin, topics []string) (map[string]*sarama.TopicMetadata, error) {
	meta, err := admin.DescribeTopics(topics)
	if err != nil {
		return nil, err
	}
	byName := make(map[string]*sarama.TopicMetadata, len(meta))
	for _, m := range meta {
		byName[m.Name] = m
	}
	return byName, nil
}

// waitVisible polls the metadata until every topic of names has partitions
// with leaders: a topic just created reaches the brokers' metadata a moment
// later.
func waitVisible(ctx context.Context, admin sarama.ClusterAdmin, names []string) error {
	if len(names) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pause := 10 * time.Millisecond
	for {
		meta, err := describe(admin, names)
		if err == nil {
			missing := ""
			for _, n := range names {
				if m := meta[n]; m == nil || !errors.Is(m.Err, sarama.ErrNoError) || len(m.Partitions) == 0 || !leaders(m) {
					missing = n
					break
				}
			}
			if missing == "" {
				return nil
			}
			err = fmt.Errorf("retry topic %q has no leader yet", missing)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(pause):
			pause = min(2*pause, 500*time.Millisecond)
		}
	}
}

func leaders(m *sarama.TopicMetadata) bool {
	for _, p := range m.Partitions {
		if !errors.Is(p.Err, sarama.ErrNoError) || p.Leader < 0 {
			return false
		}
	}
	return true
}

// RetryTopics returns the retry topics of a main topic, in the order of
// RetryConfig.Delays, or nil for a topic not in RetryConfig.Topics.
func (r *Retry) RetryTopics(topic string) []string {
	return slices.Clone(r.retryTopics[topic])
}

// Redeliver publishes msg, a copy of a message consumed from topic, to
// topic's retry topic of the shortest delay of the ladder that is at least
// delay (the longest delay if none is), with a [DueHeader] of now plus that
// delay. It returns nil once the brokers acknowledged the record
// (RetryConfig.RequiredAcks), an error otherwise: for a topic not in
// RetryConfig.Topics (wrapping inbox.ErrInvalidArgument), a copy the
// Marshaler refuses, a failed produce, a closed Retry (wrapping
// inbox.ErrClosed), or ctx ending first (the record may still be written:
// a copy twice is harmless, the inbox drops the second).
func (r *Retry) Redeliver(ctx context.Context, topic string, msg *message.Message, delay time.Duration) error {
	names, ok := r.retryTopics[topic]
	if !ok {
		return fmt.Errorf("%w: inboxkafka: topic %q has no retry topics (it is not in RetryConfig.Topics %v)", inbox.ErrInvalidArgument, topic, r.cfg.Topics)
	}
	rung := ladder.Round(r.cfg.Delays, delay)
	name, wait := names[rung], r.cfg.Delays[rung]
	pm, err := r.cfg.Marshaler.Marshal(name, msg)
	if err != nil {
		return fmt.Errorf("inboxkafka: marshaling message %s for retry topic %q: %w", msg.UUID, name, err)
	}
	pm.Topic = name
	due := time.Now().Add(wait).UnixNano()
	dueMs := due / 1e6
	if due%1e6 != 0 {
		dueMs++ // never earlier than now + wait
	}
	pm.Headers = slices.DeleteFunc(pm.Headers, func(h sarama.RecordHeader) bool { return string(h.Key) == DueHeader })
	pm.Headers = append(pm.Headers, sarama.RecordHeader{Key: []byte(DueHeader), Value: strconv.AppendInt(nil, dueMs, 10)})

	if err := ctx.Err(); err != nil {
		return fmt.Errorf("inboxkafka: handing message %s to retry topic %q: %w", msg.UUID, name, err)
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("%w: inboxkafka: Retry is closed; message %s not handed to retry topic %q", inbox.ErrClosed, msg.UUID, name)
	}
	r.sending.Add(1)
	r.mu.Unlock()

	type result struct {
		partition int32
		offset    int64
		err       error
	}
	done := make(chan result, 1)
	go func() {
		defer r.sending.Done()
		p, o, err := r.producer.SendMessage(pm)
		done <- result{p, o, err}
	}()
	fields := watermill.LogFields{"message_uuid": msg.UUID, "topic": topic, "retry_topic": name, "delay": wait.String(), "wait": delay.String()}
	select {
	case res := <-done:
		if res.err != nil {
			r.log.Error("Handing a message to its retry topic failed", res.err, fields)
			return fmt.Errorf("inboxkafka: producing message %s to retry topic %q: %w", msg.UUID, name, res.err)
		}
		r.log.Trace("Message handed to its retry topic", fields.Add(watermill.LogFields{"kafka_partition": res.partition, "kafka_partition_offset": res.offset}))
		return nil
	case <-ctx.Done():
		return fmt.Errorf("inboxkafka: handing message %s to retry topic %q: %w", msg.UUID, name, ctx.Err())
	}
}

// Close closes the subscribers that [Retry.Subscriber] returned (and the
// subscribers they wrap), waits for the hand-offs in flight and closes the
// producer. Redeliver fails after Close. Close the router (and the
// inboxmw.Inbox) first: a message handed off meanwhile fails its hand-off
// and falls back to the broker's own redelivery.
func (r *Retry) Close() error {
	r.mu.Lock()
	r.closed = true
	subs := r.subscribers
	r.subscribers = nil
	r.mu.Unlock()
	var errs []error
	for _, s := range subs {
		errs = append(errs, s.Close())
	}
	r.sending.Wait()
	r.producerOnce.Do(func() {
		if err := r.producer.Close(); err != nil {
			r.producerErr = fmt.Errorf("inboxkafka: closing the retry topics' producer: %w", err)
		}
	})
	return errors.Join(append(errs, r.producerErr)...)
}
