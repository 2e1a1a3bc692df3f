// Pipeline: three Watermill routers in a row, each behind the inbox
// middleware, so that an order is handled once at every stage however often
// it is delivered, and a stage that runs twice does not make the next one
// run twice.
//
//	orders (RabbitMQ) -> reserve-stock (Redis store) -> Kafka topic
//	  -> create-invoice (PostgreSQL, transactional: the invoice row, the
//	     invoice event and the mark commit together; the event goes through
//	     Watermill's SQL publisher into an outbox table)
//	  -> outbox -> Watermill's forwarder -> invoices (RabbitMQ)
//	  -> email-invoice (Redis store; the mail API gets an idempotency key
//	     derived from the message)
//
// The publisher sends five orders, two of them twice (a producer retry with
// the same IdempotencyKey). The publish of order-3's event to Kafka is
// reported failed once after Kafka took it (a lost confirm): the router
// nacks, reserve-stock runs again for order-3 and publishes its event again.
// Its effect, outside any transaction, happens twice (the window the
// README's guarantee names); its event, whose id the middleware derived
// from order-3's key and its position, is the same message both times, so
// create-invoice drops the second copy and every order is invoiced and
// emailed once.
//
//	cd examples/pipeline && go run .
//
// Environment (defaults: the local services of the repository's tests):
//
//	AMQP_URL       RabbitMQ (amqp://guest:guest@127.0.0.1:5672/)
//	REDIS_URL      Redis, for the stores of reserve-stock and email-invoice
//	               (redis://127.0.0.1:6379/0)
//	POSTGRES_URL   PostgreSQL, for create-invoice and the outbox
//	               (postgres://postgres@127.0.0.1:5432/test?sslmode=disable)
//	KAFKA_BROKERS  comma-separated brokers; when unset, an in-process kfake
//	               cluster
//
// Each run uses queues, a topic, tables and a Redis key prefix of its own,
// and removes them at the end.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/amqp"
	"github.com/watermill-inbox/inbox/kafka"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores"
	_ "github.com/watermill-inbox/inbox/stores/redis"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	_ "github.com/watermill-inbox/inbox/stores/sql/postgres" // the dialect, and the database/sql driver "pgx"
	"github.com/watermill-inbox/inbox/stores/sql/txinbox"
)

func main() {
	cfg := Config{
		AMQPURL:     envOr("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		RedisURL:    envOr("REDIS_URL", "redis://127.0.0.1:6379/0"),
		PostgresURL: envOr("POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		Timeout:     time.Minute,
	}
	if v := os.Getenv("KAFKA_BROKERS"); v != "" {
		cfg.Brokers = strings.Split(v, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := Run(ctx, cfg, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Config is what the example needs.
type Config struct {
	AMQPURL     string
	RedisURL    string
	PostgresURL string
	// Brokers of a real Kafka cluster; empty starts an in-process kfake
	// cluster.
	Brokers []string
	// Timeout bounds the wait for every order to be emailed.
	Timeout time.Duration
}

// Summary counts what each stage did.
type Summary struct {
	Published int // messages the publisher sent
	Orders    int // distinct orders among them
	Reserved  int // reserve-stock's effects (order-3's twice: its event's publish was reported failed)
	Invoiced  int // create-invoice's invoice rows
	Emailed   int // emails the mail API sent
	// Dropped are the duplicates each stage's inbox acked without running
	// the handler: the producer's retries at reserve-stock, reserve-stock's
	// second event for order-3 at create-invoice.
	DroppedReserve, DroppedInvoice, DroppedEmail int
}

func (s Summary) String() string {
	return fmt.Sprintf("stock reserved %d times, invoices %d, emails %d; duplicates dropped: reserve-stock %d, create-invoice %d, email-invoice %d",
		s.Reserved, s.Invoiced, s.Emailed, s.DroppedReserve, s.DroppedInvoice, s.DroppedEmail)
}

// deliveries are the orders the publisher sends, by IdempotencyKey:
// order-2 and order-4 are sent twice (producer retries).
var deliveries = []string{"order-1", "order-2", "order-2", "order-3", "order-4", "order-5", "order-4"}

// lostConfirm is the order whose event's first publish to Kafka is reported
// failed after Kafka took it.
const lostConfirm = "order-3"

// kafkaVersion is the protocol version of the Kafka clients (2.1 works with
// Kafka 2.1 and newer, and with kfake).
var kafkaVersion = sarama.V2_1_0_0

// Run runs the pipeline until every order is emailed, prints what happens
// to out and returns the counts.
func Run(ctx context.Context, cfg Config, out io.Writer) (Summary, error) {
	var sum Summary
	logger := watermill.NopLogger{}
	run := strings.ToLower(watermill.NewShortUUID()[:10])
	p := &pipeline{out: out, reserved: map[string]int{}, mail: &mailAPI{sent: map[string]string{}}}

	// The brokers: RabbitMQ, and Kafka (a real cluster, or in-process).
	ordersQueue, invoicesQueue := "inbox-example-orders-"+run, "inbox-example-invoices-"+run
	topic := "inbox-example-stock-reserved-" + run
	amqpCfg := amqp.NewDurableQueueConfig(cfg.AMQPURL)
	amqpCfg.Marshaler = inboxamqp.Marshaler{} // ids and timestamps through AMQP properties
	amqpCfg.Publish.ConfirmDelivery = true
	defer deleteQueues(cfg.AMQPURL, out, ordersQueue, invoicesQueue)
	brokers := cfg.Brokers
	if len(brokers) == 0 {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
		if err != nil {
			return sum, fmt.Errorf("start kfake: %w", err)
		}
		defer cluster.Close()
		brokers = cluster.ListenAddrs()
	} else {
		if err := createTopic(brokers, topic); err != nil {
			return sum, err
		}
		defer deleteTopic(brokers, topic, out)
	}
	fmt.Fprintf(out, "queues %s and %s, Kafka topic %s\n", ordersQueue, invoicesQueue, topic)

	// The stores: Redis for the two leased stages, under a prefix of this
	// run; PostgreSQL for the transactional one, with its tables.
	redisStore, err := stores.Open(ctx, withQuery(cfg.RedisURL, "prefix", "inbox-example-"+run+":"))
	if err != nil {
		return sum, err
	}
	defer redisStore.Close()
	defer forgetAll(redisStore, out)
	db, err := sql.Open("pgx", cfg.PostgresURL)
	if err != nil {
		return sum, err
	}
	defer db.Close()
	tables := newTables(run)
	defer tables.drop(db, out)
	if err := tables.create(ctx, db); err != nil {
		return sum, err
	}

	// The routers, one per stage, and the forwarder.
	routers, err := newRouters(logger)
	if err != nil {
		return sum, err
	}
	counts := map[string]*counter{"reserve-stock": {}, "create-invoice": {}, "email-invoice": {}}
	if err := p.reserveStock(routers[0], redisStore, amqpCfg, brokers, ordersQueue, topic, counts["reserve-stock"]); err != nil {
		return sum, err
	}
	if err := p.createInvoice(routers[1], db, tables, brokers, topic, invoicesQueue, run, counts["create-invoice"]); err != nil {
		return sum, err
	}
	fwd, err := newForwarder(db, amqpCfg, tables.outboxTopic, logger)
	if err != nil {
		return sum, err
	}
	if err := p.emailInvoice(routers[2], redisStore, amqpCfg, invoicesQueue, counts["email-invoice"]); err != nil {
		return sum, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(routers)+1)
	for _, r := range []runner{routers[0], routers[1], routers[2], fwd} {
		wg.Add(1)
		started := make(chan error, 1)
		go func() {
			defer wg.Done()
			err := r.Run(runCtx)
			started <- err
			errs <- err
		}()
		select {
		case <-r.Running():
		case err := <-started:
			return sum, fmt.Errorf("a router stopped at start: %v", err)
		}
	}

	// The publisher sends the orders, retries included.
	pub, err := amqp.NewPublisher(amqpCfg, logger)
	if err != nil {
		return sum, err
	}
	defer pub.Close()
	orders := map[string]bool{}
	for _, id := range deliveries {
		msg := message.NewMessage(watermill.NewUUID(), []byte(id))
		msg.Metadata.Set(keying.DefaultIDMetadataKey, id)
		if err := pub.Publish(ordersQueue, msg); err != nil {
			return sum, fmt.Errorf("publish %s: %w", id, err)
		}
		orders[id] = true
	}
	sum.Published, sum.Orders = len(deliveries), len(orders)

	// Wait until every order is emailed and each stage dropped what it
	// should, then stop.
	waitErr := waitUntil(ctx, cfg.Timeout, func() bool {
		return counts["email-invoice"].get(inboxmw.OutcomeProcessed) == sum.Orders &&
			counts["reserve-stock"].get(inboxmw.OutcomeDuplicate) == sum.Published-sum.Orders &&
			counts["create-invoice"].get(inboxmw.OutcomeDuplicate) == 1
	})
	cancel()
	for _, r := range routers {
		_ = r.Close()
	}
	_ = fwd.Close()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			waitErr = errors.Join(waitErr, err)
		}
	}

	sum.Reserved = p.reservedTotal()
	sum.Invoiced, err = tables.invoices(db)
	waitErr = errors.Join(waitErr, err)
	sum.Emailed = p.mail.count()
	sum.DroppedReserve = counts["reserve-stock"].get(inboxmw.OutcomeDuplicate)
	sum.DroppedInvoice = counts["create-invoice"].get(inboxmw.OutcomeDuplicate)
	sum.DroppedEmail = counts["email-invoice"].get(inboxmw.OutcomeDuplicate)
	fmt.Fprintf(out, "\npublished %d messages for %d orders\n%s\n", sum.Published, sum.Orders, sum)
	return sum, waitErr
}

// pipeline holds the stages' handlers and what they did.
type pipeline struct {
	out io.Writer

	mu       sync.Mutex
	reserved map[string]int // reserve-stock's effects by order
	mail     *mailAPI
}

func (p *pipeline) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.out, format, args...)
}

func (p *pipeline) reservedTotal() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.reserved {
		n += c
	}
	return n
}

// reserveStock is stage 1: RabbitMQ -> the inbox over Redis -> Kafka. Its
// effect (a stock reservation, kept in memory here) is outside any
// transaction. The event it returns has no IdempotencyKey: the middleware
// derives one from the order's inbox key and the event's position.
func (p *pipeline) reserveStock(r *message.Router, store inbox.LeaseStore, amqpCfg amqp.Config, brokers []string, queue, topic string, c *counter) error {
	ib, err := inboxmw.New(inboxmw.Config{
		Store:     store,
		Bus:       "rabbit",
		Group:     queue,
		Timestamp: inboxamqp.Timestamp, // a redelivery older than the store's retention is counted as stale
		Metrics:   c,
	})
	if err != nil {
		return err
	}
	sub, err := amqp.NewSubscriber(amqpCfg, watermill.NopLogger{})
	if err != nil {
		return err
	}
	kpub, err := kafkaPublisher(brokers)
	if err != nil {
		return err
	}
	pub := &confirmLost{Publisher: kpub, p: p}
	r.AddMiddleware(ib.Middleware)
	r.AddHandler("reserve-stock", queue, sub, topic, pub, func(msg *message.Message) ([]*message.Message, error) {
		order := string(msg.Payload)
		p.mu.Lock()
		p.reserved[order]++
		n := p.reserved[order]
		p.mu.Unlock()
		p.printf("%s  reserve-stock: stock reserved (times: %d)\n", order, n)
		event := message.NewMessage(watermill.NewUUID(), []byte(order)) // its id is derived by the middleware
		return []*message.Message{event}, nil
	})
	return nil
}

// confirmLost is the Kafka publisher of reserve-stock: it reports the first
// publish of lostConfirm's event failed after Kafka took it, as a lost
// acknowledgement would. The router nacks, and reserve-stock runs again.
type confirmLost struct {
	message.Publisher
	p    *pipeline
	once sync.Once
}

func (c *confirmLost) Publish(topic string, msgs ...*message.Message) error {
	if err := c.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	var lost error
	for _, m := range msgs {
		if string(m.Payload) == lostConfirm {
			c.once.Do(func() {
				lost = errors.New("acknowledgement lost")
				c.p.printf("%s  reserve-stock: event %s published, but its publish reported failed: the router nacks, the handler runs again\n", lostConfirm, m.UUID)
			})
		}
	}
	return lost
}

// createInvoice is stage 2: Kafka -> the transactional inbox on PostgreSQL.
// The invoice row, the invoice event (through Watermill's SQL publisher on
// the handler's transaction, in the forwarder's envelope) and the mark
// commit together.
func (p *pipeline) createInvoice(r *message.Router, db *sql.DB, tables tables, brokers []string, topic, invoicesQueue, run string, c *counter) error {
	txs, err := txinbox.New(txinbox.Config{
		DB:      db,
		Dialect: sqlstore.Postgres,
		Table:   tables.inbox,
		Outbox: func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) error {
			sqlPub, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, watermill.NopLogger{})
			if err != nil {
				return err
			}
			outbox := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: tables.outboxTopic})
			return outbox.Publish(invoicesQueue, msgs...) // the forwarder relays them to RabbitMQ
		},
	})
	if err != nil {
		return err
	}
	ib, err := inboxmw.New(inboxmw.Config{
		Store:     txs,
		Bus:       "kafka",
		Group:     "create-invoice-" + run,
		Timestamp: inboxkafka.Timestamp, // a record older than the store's retention is counted as stale
		Metrics:   c,
	})
	if err != nil {
		return err
	}
	sub, err := kafkaSubscriber(brokers, "create-invoice-"+run)
	if err != nil {
		return err
	}
	r.AddMiddleware(p.reportDuplicate("create-invoice"), ib.Middleware)
	r.AddHandler("create-invoice", topic, sub, "unused", refuse{}, func(msg *message.Message) ([]*message.Message, error) {
		order := string(msg.Payload)
		ran(msg)
		tx, _ := txinbox.TxFromContext(msg.Context())
		if _, err := tx.ExecContext(msg.Context(), "INSERT INTO "+tables.invoicesTable+" (order_id) VALUES ($1)", order); err != nil {
			return nil, err
		}
		p.printf("%s  create-invoice: invoice written with its event, in one transaction (event %s)\n", order, msg.UUID)
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(order))}, nil
	})
	return nil
}

type ranKey struct{}

// reportDuplicate is a middleware outside the inbox that prints the
// deliveries the inbox acked without running the handler (ran not called).
func (p *pipeline) reportDuplicate(stage string) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			didRun := new(bool)
			msg.SetContext(context.WithValue(msg.Context(), ranKey{}, didRun))
			out, err := h(msg)
			if err == nil && !*didRun {
				p.printf("%s  %s: duplicate event %s dropped by the inbox\n", msg.Payload, stage, msg.UUID)
			}
			return out, err
		}
	}
}

// ran tells reportDuplicate that the handler ran for msg.
func ran(msg *message.Message) {
	if b, ok := msg.Context().Value(ranKey{}).(*bool); ok {
		*b = true
	}
}

// refuse is create-invoice's router publisher: txinbox hands the returned
// messages to the outbox, never to the router.
type refuse struct{}

func (refuse) Publish(string, ...*message.Message) error {
	return errors.New("the transactional stage publishes through its outbox only")
}
func (refuse) Close() error { return nil }

// newForwarder relays the outbox to RabbitMQ. A crash between its publish
// and its ack sends an event twice, with the same id: email-invoice's inbox
// drops the second copy.
func newForwarder(db *sql.DB, amqpCfg amqp.Config, outboxTopic string, logger watermill.LoggerAdapter) (*forwarder.Forwarder, error) {
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		ConsumerGroup:  "forwarder",
		SchemaAdapter:  wsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
		PollInterval:   100 * time.Millisecond,
	}, logger)
	if err != nil {
		return nil, err
	}
	pub, err := amqp.NewPublisher(amqpCfg, logger)
	if err != nil {
		return nil, err
	}
	return forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: outboxTopic})
}

// emailInvoice is stage 3: RabbitMQ -> the inbox over Redis -> a mail API.
// The API call is the handler's own effect: its idempotency key, derived
// from the message's inbox key, is the same on every run of the handler
// for this message, so the API sends the email once even when the handler
// runs twice (a crash after the call, before the mark).
func (p *pipeline) emailInvoice(r *message.Router, store inbox.LeaseStore, amqpCfg amqp.Config, queue string, c *counter) error {
	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "rabbit", Group: queue, Timestamp: inboxamqp.Timestamp, Metrics: c})
	if err != nil {
		return err
	}
	sub, err := amqp.NewSubscriber(amqpCfg, watermill.NopLogger{})
	if err != nil {
		return err
	}
	r.AddMiddleware(ib.Middleware)
	r.AddConsumerHandler("email-invoice", queue, sub, func(msg *message.Message) error {
		order := string(msg.Payload)
		key, err := inboxmw.DerivedKey(msg.Context(), "invoice-email")
		if err != nil {
			return err
		}
		if first := p.mail.send(key, order); first {
			p.printf("%s  email-invoice: emailed (mail API idempotency key %s)\n", order, key)
		}
		return nil
	})
	return nil
}

// mailAPI stands for an email service that takes an idempotency key, as
// payment and email APIs do: a request repeated with the same key is not
// sent again.
type mailAPI struct {
	mu   sync.Mutex
	sent map[string]string // idempotency key -> order
}

func (m *mailAPI) send(key, order string) (first bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.sent[key]; dup {
		return false
	}
	m.sent[key] = order
	return true
}

func (m *mailAPI) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sent)
}

// ---- Plumbing ----------------------------------------------------------

// runner is a router, or the forwarder (whose router it wraps).
type runner interface {
	Run(ctx context.Context) error
	Running() chan struct{}
}

func newRouters(logger watermill.LoggerAdapter) ([]*message.Router, error) {
	var rs []*message.Router
	for range 3 {
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
		if err != nil {
			return nil, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}

func kafkaPublisher(brokers []string) (message.Publisher, error) {
	cfg := kafka.DefaultSaramaSyncPublisherConfig()
	cfg.Version = kafkaVersion
	return kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: cfg}, watermill.NopLogger{})
}

func kafkaSubscriber(brokers []string, group string) (message.Subscriber, error) {
	cfg := kafka.DefaultSaramaSubscriberConfig()
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Version = kafkaVersion
	return kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: brokers, Unmarshaler: kafka.DefaultMarshaler{}, ConsumerGroup: group, OverwriteSaramaConfig: cfg,
	}, watermill.NopLogger{})
}

func createTopic(brokers []string, topic string) error {
	cfg := sarama.NewConfig()
	cfg.Version = kafkaVersion
	admin, err := sarama.NewClusterAdmin(brokers, cfg)
	if err != nil {
		return err
	}
	defer admin.Close()
	return admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false)
}

func deleteTopic(brokers []string, topic string, out io.Writer) {
	cfg := sarama.NewConfig()
	cfg.Version = kafkaVersion
	admin, err := sarama.NewClusterAdmin(brokers, cfg)
	if err == nil {
		defer admin.Close()
		err = admin.DeleteTopic(topic)
	}
	if err != nil {
		fmt.Fprintf(out, "could not delete topic %s: %v\n", topic, err)
	}
}

// tables are the PostgreSQL tables of a run.
type tables struct {
	inbox, invoicesTable, outboxTopic string
}

func newTables(run string) tables {
	return tables{inbox: "inbox_example_" + run, invoicesTable: "invoices_" + run, outboxTopic: "inbox_example_outbox_" + run}
}

// create makes the inbox table, the invoices table, and the outbox's
// tables (watermill-sql's, for its topic and its consumer group).
func (t tables) create(ctx context.Context, db *sql.DB) error {
	st, err := sqlstore.New(ctx, db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: t.inbox, AutoMigrate: true})
	if err != nil {
		return err
	}
	_ = st.Close() // it made the table; txinbox uses it
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+t.invoicesTable+" (order_id TEXT NOT NULL)"); err != nil {
		return fmt.Errorf("creating the invoices table: %w", err)
	}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		ConsumerGroup: "forwarder", SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer sub.Close()
	return sub.SubscribeInitialize(t.outboxTopic)
}

func (t tables) invoices(db *sql.DB) (n int, err error) {
	err = db.QueryRow("SELECT COUNT(*) FROM " + t.invoicesTable).Scan(&n)
	return n, err
}

func (t tables) drop(db *sql.DB, out io.Writer) {
	for _, tb := range []string{t.inbox, t.inbox + "_order", t.invoicesTable,
		wsql.DefaultPostgreSQLSchema{}.MessagesTable(t.outboxTopic), wsql.DefaultPostgreSQLOffsetsAdapter{}.MessagesOffsetsTable(t.outboxTopic)} {
		if _, err := db.Exec("DROP TABLE IF EXISTS " + tb); err != nil {
			fmt.Fprintf(out, "could not drop table %s: %v\n", tb, err)
		}
	}
}

// forgetAll deletes the run's keys from the Redis store (inbox.Admin).
func forgetAll(store stores.Store, out io.Writer) {
	admin, ok := store.(inbox.Admin)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var keys []string
	for cursor := ""; ; {
		page, err := admin.List(ctx, inbox.ListOptions{Cursor: cursor})
		if err != nil {
			fmt.Fprintf(out, "could not list the run's inbox keys: %v\n", err)
			return
		}
		for _, it := range page.Items {
			keys = append(keys, it.Key)
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := admin.Forget(ctx, k); err != nil {
			fmt.Fprintf(out, "could not forget %s: %v\n", k, err)
		}
	}
}

func withQuery(raw, k, v string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw // stores.Open reports it
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

func deleteQueues(amqpURL string, out io.Writer, queues ...string) {
	conn, err := amqp091.Dial(amqpURL)
	if err == nil {
		defer conn.Close()
		var ch *amqp091.Channel
		if ch, err = conn.Channel(); err == nil {
			for _, q := range queues {
				if _, qerr := ch.QueueDelete(q, false, false, false); qerr != nil {
					err = errors.Join(err, qerr)
				}
			}
		}
	}
	if err != nil {
		fmt.Fprintf(out, "could not delete queues %s: %v\n", strings.Join(queues, ", "), err)
	}
}

func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			return fmt.Errorf("not every order was emailed within %s", timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// counter is an inboxmw.Metrics that counts outcomes.
type counter struct {
	mu sync.Mutex
	n  map[inboxmw.Outcome]int
}

func (c *counter) Outcome(_ string, o inboxmw.Outcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[inboxmw.Outcome]int{}
	}
	c.n[o]++
}

func (c *counter) StoreCall(string, time.Duration, error) {}
func (c *counter) Waited(string, string, time.Duration)   {}

func (c *counter) get(o inboxmw.Outcome) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[o]
}
