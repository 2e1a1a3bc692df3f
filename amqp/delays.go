package inboxamqp

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/ladder"
	inboxmw "github.com/watermill-inbox/inbox/middleware"
)

// ErrBroker is wrapped by the errors of [Delays] that come from RabbitMQ: it
// cannot be reached, refuses a declaration (permissions, a queue that
// exists with other arguments) or does not confirm a copy.
var ErrBroker = errors.New("inboxamqp: broker")

// DefaultDelays is the ladder of delays [Delays] uses unless
// DelaysConfig.Delays names others: 250 ms, 500 ms, 1 s, 2 s, 5 s, 10 s,
// 20 s, 30 s and 1 min. It covers inboxmw.DefaultBackoff (at most a minute):
// a copy waits at least its backoff and, from 250 ms up, less than 2.5
// times it (the step from 2 s to 5 s).
var DefaultDelays = ladder.Default

// DefaultMaxChannels is the default of DelaysConfig.MaxChannels.
const DefaultMaxChannels = 16

// DelaysConfig configures [NewDelays].
type DelaysConfig struct {
	// URI is the AMQP URI of the broker and virtual host the consumers read
	// from, e.g. "amqp://guest:guest@127.0.0.1:5672/". Required.
	URI string

	// Queues are the queues whose delay queues [NewDelays] declares, so that
	// a setup that cannot declare them fails there and not at the first
	// failed message. Optional: a queue not listed gets its delay queues
	// declared at its first hand-off.
	Queues []string

	// QueueName maps a router topic to the queue its handler consumes.
	// Default: the topic itself, as in watermill-amqp's
	// NewDurableQueueConfig and NewNonDurableQueueConfig; with another
	// config, pass its Queue.GenerateName.
	QueueName amqp.QueueNameGenerator

	// Delays are the delays the broker holds, one delay queue each per
	// queue: whole milliseconds, increasing. A wait is rounded up to the
	// next delay; a wait longer than the last takes the last (the copy then
	// comes back early and is handed off again for the rest). Default
	// [DefaultDelays].
	Delays []time.Duration

	// DelayQueueName names the delay queue of queue for delay d. Default
	// [DelayQueueName]: "orders.inbox-delay-5s".
	DelayQueueName func(queue string, d time.Duration) string

	// Marshaler turns a copy into an AMQP publishing. Default this
	// package's [Marshaler], which the consumers must use too: RabbitMQ adds
	// an x-death table header to a dead-lettered copy, which watermill-amqp's
	// DefaultMarshaler refuses (and requeues, in a loop).
	Marshaler amqp.Marshaler

	// MaxChannels bounds the hand-offs in flight: each uses an AMQP channel
	// in confirm mode of its own. Default [DefaultMaxChannels].
	MaxChannels int

	// Logger receives connection losses and declarations. Default
	// watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

// DelayQueueName is the default of DelaysConfig.DelayQueueName:
// queue + ".inbox-delay-" + d (Go's duration format: "250ms", "5s", "1m0s").
func DelayQueueName(queue string, d time.Duration) string {
	return queue + ".inbox-delay-" + d.String()
}

func (c *DelaysConfig) setDefaults() {
	if c.QueueName == nil {
		c.QueueName = amqp.GenerateQueueNameTopicName
	}
	if len(c.Delays) == 0 {
		c.Delays = DefaultDelays
	}
	if c.DelayQueueName == nil {
		c.DelayQueueName = DelayQueueName
	}
	if c.Marshaler == nil {
		c.Marshaler = Marshaler{}
	}
	if c.MaxChannels == 0 {
		c.MaxChannels = DefaultMaxChannels
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

// Validate reports every problem of c (after defaults), joined, each
// wrapping [inbox.ErrInvalidArgument].
func (c DelaysConfig) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: inboxamqp: DelaysConfig: "+format, append([]any{inbox.ErrInvalidArgument}, args...)...))
	}
	if c.URI == "" {
		bad("URI is required")
	} else if u, err := url.Parse(c.URI); err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") {
		bad("URI %q is not an amqp:// or amqps:// URI", redact(c.URI))
	}
	if err := ladder.Validate(c.Delays, inbox.ErrInvalidArgument); err != nil {
		errs = append(errs, fmt.Errorf("inboxamqp: DelaysConfig.Delays: %w", err))
	}
	if c.MaxChannels < 0 {
		bad("MaxChannels %d is negative", c.MaxChannels)
	}
	for _, q := range c.Queues {
		if q == "" {
			bad("Queues holds an empty name")
		}
	}
	return errors.Join(errs...)
}

// Delays holds failed attempts' copies in RabbitMQ until their backoff
// ends: an [inboxmw.Redeliverer] for Config.Redelivery. See the package
// documentation. It is safe for concurrent use.
type Delays struct {
	cfg  DelaysConfig
	log  watermill.LoggerAdapter
	idle chan *confirmChannel // channels ready for a publish
	slot chan struct{}        // one token per channel that may exist

	mu       sync.Mutex
	conn     *amqp091.Connection
	dialErr  error     // the last failed dial
	dialedAt time.Time // and when, so that an outage costs a dial a second
	closed   bool
	declared map[string]bool // queues whose delay queues exist
}

var _ inboxmw.Redeliverer = (*Delays)(nil)

// redialEvery is the least time between two dials after a failed one.
const redialEvery = time.Second

// NewDelays connects to cfg.URI and declares the delay queues of
// cfg.Queues. It fails with an error wrapping [inbox.ErrInvalidArgument]
// for a bad config, or [ErrBroker] when RabbitMQ cannot be reached or
// refuses a declaration (a wrong vhost or password, missing permissions, a
// delay queue that exists with other arguments), saying which.
func NewDelays(ctx context.Context, cfg DelaysConfig) (*Delays, error) {
	cfg.Queues = append([]string(nil), cfg.Queues...)
	cfg.Delays = append([]time.Duration(nil), cfg.Delays...)
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Delays{
		cfg:      cfg,
		log:      cfg.Logger.With(watermill.LogFields{"component": "inboxamqp.Delays"}),
		idle:     make(chan *confirmChannel, cfg.MaxChannels),
		slot:     make(chan struct{}, cfg.MaxChannels),
		declared: map[string]bool{},
	}
	for range cfg.MaxChannels {
		d.slot <- struct{}{}
	}
	if _, err := d.connection(); err != nil {
		return nil, err
	}
	for _, q := range cfg.Queues {
		if err := d.declare(ctx, q, false); err != nil {
			_ = d.Close()
			return nil, err
		}
	}
	return d, nil
}

// Redeliver implements [inboxmw.Redeliverer]: it publishes msg to the delay
// queue of topic's queue whose delay is the shortest at least delay (or the
// longest), which dead-letters it back to the queue when the delay ends,
// and returns once RabbitMQ confirmed it. RabbitMQ's x-death headers of an
// earlier round are left out of the copy.
func (d *Delays) Redeliver(ctx context.Context, topic string, msg *message.Message, delay time.Duration) error {
	queue := d.cfg.QueueName(topic)
	if queue == "" {
		return fmt.Errorf("%w: inboxamqp: topic %q maps to no queue", inbox.ErrInvalidArgument, topic)
	}
	if err := d.declare(ctx, queue, true); err != nil {
		return err
	}
	rung := d.cfg.Delays[ladder.Round(d.cfg.Delays, delay)]
	name := d.cfg.DelayQueueName(queue, rung)
	// msg is the middleware's copy (inboxmw.Redeliverer): changed in place.
	for k := range msg.Metadata {
		if k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-") {
			delete(msg.Metadata, k)
		}
	}
	p, err := d.cfg.Marshaler.Marshal(msg)
	if err != nil {
		return fmt.Errorf("inboxamqp: marshal the copy of message %s: %w", msg.UUID, err)
	}
	p.Expiration = "" // the delay queue's TTL is the delay
	return d.withChannel(ctx, func(c *confirmChannel) error { return c.publish(ctx, name, p) })
}

// declare makes sure queue exists and has its delay queues, once per queue.
// With mustExist, a missing queue is an error (copies dead-lettered to it
// would be dropped); at setup the consumers may not have declared it yet.
func (d *Delays) declare(ctx context.Context, queue string, mustExist bool) error {
	d.mu.Lock()
	done := d.declared[queue]
	d.mu.Unlock()
	if done {
		return nil
	}
	err := d.withChannel(ctx, func(c *confirmChannel) error {
		if mustExist {
			if _, err := c.ch.QueueDeclarePassive(queue, false, false, false, false, nil); err != nil {
				return fmt.Errorf("%w: queue %q does not exist in vhost %q, so copies dead-lettered to it would be lost: %v", ErrBroker, queue, d.vhost(), err)
			}
		}
		for _, delay := range d.cfg.Delays {
			name := d.cfg.DelayQueueName(queue, delay)
			args := amqp091.Table{
				"x-message-ttl":             delay.Milliseconds(),
				"x-dead-letter-exchange":    "",
				"x-dead-letter-routing-key": queue,
			}
			if _, err := c.ch.QueueDeclare(name, true, false, false, false, args); err != nil {
				return fmt.Errorf("%w: cannot declare delay queue %q (TTL %s, dead-lettering to %q) in vhost %q: %v",
					ErrBroker, name, delay, queue, d.vhost(), err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.declared[queue] = true
	d.mu.Unlock()
	d.log.Debug("Delay queues declared", watermill.LogFields{"queue": queue, "delays": len(d.cfg.Delays)})
	return nil
}

// Close closes the connection. Hand-offs after Close fail with an error
// wrapping [inbox.ErrClosed].
func (d *Delays) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	if d.conn != nil {
		return d.conn.Close()
	}
	return nil
}

// withChannel runs f on a channel of the pool; a channel f failed on is
// dropped (its state is unknown), the others go back to the pool.
func (d *Delays) withChannel(ctx context.Context, f func(*confirmChannel) error) error {
	var c *confirmChannel
	for c == nil {
		select {
		case c = <-d.idle:
		case <-d.slot:
			var err error
			if c, err = d.newChannel(); err != nil {
				d.slot <- struct{}{}
				return err
			}
		case <-ctx.Done():
			return fmt.Errorf("%w: inboxamqp: waiting for a free channel: %w", ErrBroker, ctx.Err())
		}
		if c.ch.IsClosed() { // its connection was lost while it was idle
			c = nil
			d.slot <- struct{}{}
		}
	}
	err := f(c)
	if err != nil || c.ch.IsClosed() {
		_ = c.ch.Close()
		d.slot <- struct{}{}
		return err
	}
	d.idle <- c
	return nil
}

func (d *Delays) newChannel() (*confirmChannel, error) {
	conn, err := d.connection()
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("%w: inboxamqp: open a channel: %v", ErrBroker, err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("%w: inboxamqp: put a channel in confirm mode: %v", ErrBroker, err)
	}
	return &confirmChannel{ch: ch, returns: ch.NotifyReturn(make(chan amqp091.Return, 1))}, nil
}

// connection returns the live connection, dialing when there is none (at
// most once a second while dials fail).
func (d *Delays) connection() (*amqp091.Connection, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.closed:
		return nil, fmt.Errorf("inboxamqp: delays: %w", inbox.ErrClosed)
	case d.conn != nil && !d.conn.IsClosed():
		return d.conn, nil
	case d.dialErr != nil && time.Since(d.dialedAt) < redialEvery:
		return nil, d.dialErr
	}
	if d.conn != nil {
		d.log.Info("Connection to RabbitMQ lost; dialing again", nil)
	}
	d.dialedAt = time.Now()
	conn, err := amqp091.DialConfig(d.cfg.URI, amqp091.Config{
		Properties: amqp091.Table{"connection_name": "watermill-inbox delays"},
	})
	if err != nil {
		d.dialErr = fmt.Errorf("%w: inboxamqp: cannot connect to %s: %v", ErrBroker, redact(d.cfg.URI), err)
		return nil, d.dialErr
	}
	d.conn, d.dialErr = conn, nil
	return conn, nil
}

func (d *Delays) vhost() string {
	u, err := url.Parse(d.cfg.URI)
	if err != nil || u.Path == "" || u.Path == "/" {
		return "/"
	}
	v, err := url.PathUnescape(strings.TrimPrefix(u.Path, "/"))
	if err != nil {
		return u.Path
	}
	return v
}

// confirmChannel is an AMQP channel in confirm mode, used by one publish at
// a time.
type confirmChannel struct {
	ch      *amqp091.Channel
	returns chan amqp091.Return
}

// publish sends p to queue through the default exchange, mandatory, and
// waits for RabbitMQ's confirm. RabbitMQ sends the return of an unroutable
// message before the confirm, on the same channel: a confirmed publish with
// a return waiting was not queued.
func (c *confirmChannel) publish(ctx context.Context, queue string, p amqp091.Publishing) error {
	dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, p)
	if err != nil {
		return fmt.Errorf("%w: inboxamqp: publish to delay queue %q: %v", ErrBroker, queue, err)
	}
	ok, err := dc.WaitContext(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("%w: inboxamqp: waiting for RabbitMQ to confirm the copy in delay queue %q: %w", ErrBroker, queue, err)
	case !ok:
		return fmt.Errorf("%w: inboxamqp: RabbitMQ refused (nacked) the copy for delay queue %q", ErrBroker, queue)
	}
	select {
	case r := <-c.returns:
		return fmt.Errorf("%w: inboxamqp: delay queue %q does not exist: RabbitMQ returned the copy (%d %s)", ErrBroker, queue, r.ReplyCode, r.ReplyText)
	default:
		return nil
	}
}

// redact hides the password of an AMQP URI.
func redact(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return "(an unparsable URI)"
	}
	return u.Redacted()
}
