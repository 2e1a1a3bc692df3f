package inboxkafka_test

import (
	"context"
	"errors"
	"maps"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/kafka"
)

const ms = time.Millisecond

// TestRetry_copy_arrives_when_due_with_uuid_payload_and_metadata hands a
// copy to the retry topics with a wait of 300 ms (the 500 ms rung) and
// receives it through the wrapped subscriber no earlier than 500 ms after
// the hand-off began, with the copy's UUID, payload and metadata, and
// nothing else.
func TestRetry_copy_arrives_when_due_with_uuid_payload_and_metadata(t *testing.T) {
	t.Parallel()
	eachBroker(t, func(t *testing.T, env kafkaEnv) {
		topic, group := names(t)
		env.createTopic(t, topic, 1)
		r := newRetry(t, env, topic, group, []time.Duration{200 * ms, 500 * ms, time.Second}, nil)
		ch, _ := subscribe(t, env, r, topic, group)

		sent := copyOf(watermill.NewUUID(), "kafka:billing:charge:order-1", 2)
		want := maps.Clone(sent.Metadata)
		start := time.Now()
		if err := r.Redeliver(t.Context(), topic, sent, 300*ms); err != nil {
			t.Fatalf("Redeliver: %v", err)
		}
		got := receive(t, ch, 60*time.Second, "the retry message")
		if waited := time.Since(start); waited < 500*ms {
			t.Errorf("the copy arrived %s after the hand-off began, before its 500 ms rung", waited)
		}
		if got.UUID != sent.UUID || string(got.Payload) != string(sent.Payload) {
			t.Errorf("received %s %q, want %s %q", got.UUID, got.Payload, sent.UUID, sent.Payload)
		}
		if !maps.Equal(got.Metadata, want) {
			t.Errorf("metadata = %v, want %v", got.Metadata, want)
		}
		got.Ack()
	})
}

// TestRetry_main_topic_and_shorter_rungs_move_on_while_a_retry_message_is_held
// holds a copy on the 5 s rung, then publishes to the main topic and hands a
// copy to the 200 ms rung: those arrive while the first copy is held, and
// the held copy arrives after its 5 s.
func TestRetry_main_topic_and_shorter_rungs_move_on_while_a_retry_message_is_held(t *testing.T) {
	t.Parallel()
	eachBroker(t, func(t *testing.T, env kafkaEnv) {
		topic, group := names(t)
		env.createTopic(t, topic, 1)
		logs := &logRecorder{}
		r := newRetry(t, env, topic, group, []time.Duration{200 * ms, 5 * time.Second}, logs.logger())
		ch, _ := subscribe(t, env, r, topic, group)

		publish(t, env, topic, message.NewMessage("warm-up", nil))
		if m := receive(t, ch, 60*time.Second, "the main topic's first message"); m.UUID != "warm-up" {
			t.Fatalf("received %s, want warm-up", m.UUID)
		} else {
			m.Ack()
		}

		held := copyOf(watermill.NewUUID(), "kafka:billing:charge:held", 1)
		start := time.Now()
		if err := r.Redeliver(t.Context(), topic, held, 4*time.Second); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, "the 5 s copy held", func() bool {
			return logs.count("Holding a retry message", r.RetryTopics(topic)[1]) == 1
		})

		want := map[string]bool{}
		var mains []*message.Message
		for i := range 3 {
			m := message.NewMessage("main-"+strconv.Itoa(i)+"-"+watermill.NewShortUUID(), nil)
			mains = append(mains, m)
			want[m.UUID] = true
		}
		publish(t, env, topic, mains...)
		short := copyOf(watermill.NewUUID(), "kafka:billing:charge:short", 1)
		want[short.UUID] = true
		if err := r.Redeliver(t.Context(), topic, short, 100*ms); err != nil {
			t.Fatal(err)
		}
		for len(want) > 0 {
			m := receive(t, ch, 60*time.Second, "the main topic's messages and the short copy")
			if m.UUID == held.UUID {
				t.Fatalf("the held copy arrived (%s after its hand-off) before %d of the others", time.Since(start), len(want))
			}
			if !want[m.UUID] {
				t.Fatalf("unexpected message %s", m.UUID)
			}
			delete(want, m.UUID)
			m.Ack()
		}
		m := receive(t, ch, 60*time.Second, "the held copy")
		if m.UUID != held.UUID {
			t.Fatalf("received %s, want the held copy %s", m.UUID, held.UUID)
		}
		if waited := time.Since(start); waited < 5*time.Second {
			t.Errorf("the held copy arrived %s after its hand-off, before its 5 s rung", waited)
		}
		m.Ack()
	})
}

// TestRetry_rebalance_while_held_releases_the_copy_to_the_next_owner: a
// second consumer joins the retry group while the first holds a copy; the
// first lets it go unacked when its session ends, and whichever consumer
// owns the partition next delivers it, no earlier than its due time.
func TestRetry_rebalance_while_held_releases_the_copy_to_the_next_owner(t *testing.T) {
	t.Parallel()
	eachBroker(t, func(t *testing.T, env kafkaEnv) {
		topic, group := names(t)
		env.createTopic(t, topic, 1)
		sc := saramaConfig()
		sc.Consumer.Group.Heartbeat.Interval = 100 * ms // a member learns of a rebalance quickly
		logsA, logsB := &logRecorder{}, &logRecorder{}
		cfg := inboxkafka.RetryConfig{Brokers: env.brokers, ConsumerGroup: group, Topics: []string{topic},
			Delays: []time.Duration{5 * time.Second}, SaramaConfig: sc, Logger: logsA.logger()}
		rA := newRetryWith(t, env, cfg)
		chA, _ := subscribe(t, env, rA, topic, group)

		sent := copyOf(watermill.NewUUID(), "k", 1)
		start := time.Now()
		if err := rA.Redeliver(t.Context(), topic, sent, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, "the copy held by the first consumer", func() bool {
			return logsA.count("Holding a retry message") == 1
		})
		cfg.Logger = logsB.logger()
		rB := newRetryWith(t, env, cfg)
		chB, _ := subscribe(t, env, rB, topic, group)
		testenv.Eventually(t, 30*time.Second, "the first consumer releasing the held copy at the rebalance", func() bool {
			return logsA.count("Retry message released unacked before it was due") == 1
		})

		var got *message.Message
		select {
		case got = <-chA:
		case got = <-chB:
		case <-time.After(60 * time.Second):
			t.Fatal("the copy did not come back after the rebalance")
		}
		if got == nil || got.UUID != sent.UUID {
			t.Fatalf("received %v, want %s", got, sent.UUID)
		}
		if waited := time.Since(start); waited < 5*time.Second {
			t.Errorf("the copy arrived %s after its hand-off, before its 5 s rung", waited)
		}
		got.Ack()
	})
}

// TestRetry_rounds_the_wait_up_to_a_rung_and_caps_it_at_the_top_rung reads
// the retry topics directly: each copy is on the topic of the shortest rung
// not shorter than its wait (the top rung for a longer wait), and its due
// header is the hand-off's time plus that rung.
func TestRetry_rounds_the_wait_up_to_a_rung_and_caps_it_at_the_top_rung(t *testing.T) {
	t.Parallel()
	eachBroker(t, func(t *testing.T, env kafkaEnv) {
		topic, group := names(t)
		env.createTopic(t, topic, 1)
		ladder := []time.Duration{200 * ms, 500 * ms, time.Second}
		r := newRetry(t, env, topic, group, ladder, nil)
		type sent struct {
			rung          int
			before, after time.Time
		}
		byUUID := map[string]sent{}
		perTopic := map[string]int{}
		for _, c := range []struct {
			wait time.Duration
			rung int
		}{{0, 0}, {200 * ms, 0}, {201 * ms, 1}, {500 * ms, 1}, {700 * ms, 2}, {time.Second, 2}, {time.Hour, 2}} {
			m := copyOf(watermill.NewUUID(), "k", 1)
			before := time.Now()
			if err := r.Redeliver(t.Context(), topic, m, c.wait); err != nil {
				t.Fatal(err)
			}
			byUUID[m.UUID] = sent{c.rung, before, time.Now()}
			perTopic[r.RetryTopics(topic)[c.rung]]++
		}

		consumer, err := sarama.NewConsumer(env.brokers, saramaConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer consumer.Close()
		for rung, name := range r.RetryTopics(topic) {
			pc, err := consumer.ConsumePartition(name, 0, sarama.OffsetOldest)
			if err != nil {
				t.Fatal(err)
			}
			for range perTopic[name] {
				var km *sarama.ConsumerMessage
				select {
				case km = <-pc.Messages():
				case <-time.After(30 * time.Second):
					t.Fatalf("%s: fewer than %d records", name, perTopic[name])
				}
				var id string
				var due time.Time
				for _, h := range km.Headers {
					switch string(h.Key) {
					case "_watermill_message_uuid":
						id = string(h.Value)
					case inboxkafka.DueHeader:
						n, _ := strconv.ParseInt(string(h.Value), 10, 64)
						due = time.UnixMilli(n)
					}
				}
				s, ok := byUUID[id]
				if !ok {
					t.Fatalf("%s: unknown record %q", name, id)
				}
				if s.rung != rung {
					t.Errorf("copy %s is on rung %d (%s), want rung %d", id, rung, name, s.rung)
				}
				if d := ladder[rung]; due.Before(s.before.Add(d)) || due.After(s.after.Add(d+ms)) {
					t.Errorf("copy %s on rung %s is due %s after its hand-off began, want %s (up to %s)",
						id, d, due.Sub(s.before), d, s.after.Sub(s.before)+d+ms)
				}
			}
			_ = pc.Close()
		}
	})
}

// TestRetry_nacked_retry_message_is_sent_again_and_committed_once_acked
// nacks a retry message: the same message comes again, and once it is acked
// the retry group's offset of its partition is committed past it.
func TestRetry_nacked_retry_message_is_sent_again_and_committed_once_acked(t *testing.T) {
	t.Parallel()
	eachBroker(t, func(t *testing.T, env kafkaEnv) {
		topic, group := names(t)
		env.createTopic(t, topic, 1)
		r := newRetry(t, env, topic, group, []time.Duration{100 * ms}, nil)
		ch, _ := subscribe(t, env, r, topic, group)

		sent := copyOf(watermill.NewUUID(), "k", 3)
		if err := r.Redeliver(t.Context(), topic, sent, 0); err != nil {
			t.Fatal(err)
		}
		first := receive(t, ch, 60*time.Second, "the retry message")
		first.Nack()
		again := receive(t, ch, 60*time.Second, "the nacked retry message again")
		if again.UUID != sent.UUID || string(again.Payload) != string(sent.Payload) || !maps.Equal(again.Metadata, sent.Metadata) {
			t.Fatalf("after the nack received %s %q %v, want %s %q %v", again.UUID, again.Payload, again.Metadata, sent.UUID, sent.Payload, sent.Metadata)
		}
		again.Ack()

		admin := env.admin(t)
		defer admin.Close()
		retryTopic := r.RetryTopics(topic)[0]
		testenv.Eventually(t, 30*time.Second, "the retry group's offset committed past the acked message", func() bool {
			res, err := admin.ListConsumerGroupOffsets(group+inboxkafka.RetryConsumerGroupSuffix, map[string][]int32{retryTopic: {0}})
			if err != nil {
				return false
			}
			b := res.GetBlock(retryTopic, 0)
			return b != nil && b.Offset == 1
		})
	})
}

// TestRetry_two_groups_on_one_topic_have_their_own_retry_topics: a copy
// handed off for one consumer group lands in that group's retry topics only.
func TestRetry_two_groups_on_one_topic_have_their_own_retry_topics(t *testing.T) {
	t.Parallel()
	eachBroker(t, func(t *testing.T, env kafkaEnv) {
		topic, g1 := names(t)
		_, g2 := names(t)
		env.createTopic(t, topic, 1)
		ladder := []time.Duration{100 * ms, time.Second}
		r1 := newRetry(t, env, topic, g1, ladder, nil)
		r2 := newRetry(t, env, topic, g2, ladder, nil)
		if err := r1.Redeliver(t.Context(), topic, copyOf(watermill.NewUUID(), "k", 1), 50*ms); err != nil {
			t.Fatal(err)
		}
		client, err := sarama.NewClient(env.brokers, saramaConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		for _, c := range []struct {
			r    *inboxkafka.Retry
			want []int64
		}{{r1, []int64{1, 0}}, {r2, []int64{0, 0}}} {
			for i, name := range c.r.RetryTopics(topic) {
				n, err := client.GetOffset(name, 0, sarama.OffsetNewest)
				if err != nil {
					t.Fatal(err)
				}
				if n != c.want[i] {
					t.Errorf("%s holds %d records, want %d", name, n, c.want[i])
				}
			}
		}
		if t1, t2 := r1.RetryTopics(topic), r2.RetryTopics(topic); t1[0] == t2[0] {
			t.Errorf("groups %s and %s share retry topic %s", g1, g2, t1[0])
		}
	})
}

// TestRetry_Close_while_a_message_is_held_neither_acks_it_nor_leaks closes
// the subscriber and the Retry while a copy waits for its due time: the
// channel closes, no goroutine of this package or of sarama is left, and
// the copy, uncommitted, reaches the next subscriber of the group when due.
// Not parallel: it looks at every goroutine of the test binary.
func TestRetry_Close_while_a_message_is_held_neither_acks_it_nor_leaks(t *testing.T) {
	env := newKfake(t)
	topic, group := names(t)
	env.createTopic(t, topic, 1)
	logs := &logRecorder{}
	delays := []time.Duration{2 * time.Second}
	r, err := inboxkafka.NewRetry(t.Context(), inboxkafka.RetryConfig{
		Brokers: env.brokers, ConsumerGroup: group, Topics: []string{topic}, Delays: delays,
		SaramaConfig: saramaConfig(), Logger: logs.logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	sub := r.Subscriber(mainSubscriber(t, env, group))
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	sent := copyOf(watermill.NewUUID(), "k", 1)
	start := time.Now()
	if err := r.Redeliver(t.Context(), topic, sent, time.Second); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the copy held", func() bool { return logs.count("Holding a retry message") == 1 })

	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if m, ok := <-ch; ok {
		t.Fatalf("received %s after Close", m.UUID)
	}
	if n := logs.count("Retry message released unacked before it was due"); n != 1 {
		t.Errorf("%d logs of the held message's release, want 1", n)
	}
	testenv.Eventually(t, 10*time.Second, "no goroutine of inboxkafka or sarama", func() bool {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		return !strings.Contains(stacks, "watermill-inbox/inbox/kafka.") && !strings.Contains(stacks, "IBM/sarama")
	})
	if err := r.Redeliver(t.Context(), topic, sent, 0); !errors.Is(err, inbox.ErrClosed) {
		t.Errorf("Redeliver after Close = %v, want an error wrapping inbox.ErrClosed", err)
	}

	r2 := newRetry(t, env, topic, group, delays, nil)
	ch2, _ := subscribe(t, env, r2, topic, group)
	got := receive(t, ch2, 60*time.Second, "the copy, from the next subscriber")
	if got.UUID != sent.UUID {
		t.Fatalf("received %s, want %s", got.UUID, sent.UUID)
	}
	if waited := time.Since(start); waited < delays[0] {
		t.Errorf("the copy arrived %s after its hand-off, before its %s rung", waited, delays[0])
	}
	got.Ack()
}

// TestRetry_refuses_a_topic_it_was_not_set_up_for: Redeliver and the
// wrapped Subscribe name the topic and wrap inbox.ErrInvalidArgument.
func TestRetry_refuses_a_topic_it_was_not_set_up_for(t *testing.T) {
	t.Parallel()
	env := newKfake(t)
	topic, group := names(t)
	env.createTopic(t, topic, 1)
	r := newRetry(t, env, topic, group, nil, nil)
	if n := len(r.RetryTopics(topic)); n != 9 {
		t.Errorf("%d retry topics with the default ladder, want 9", n)
	}
	err := r.Redeliver(t.Context(), "other", copyOf("id", "k", 1), time.Second)
	if !errors.Is(err, inbox.ErrInvalidArgument) || !strings.Contains(err.Error(), `"other"`) {
		t.Errorf("Redeliver(other) = %v, want an error naming the topic, wrapping ErrInvalidArgument", err)
	}
	sub := r.Subscriber(mainSubscriber(t, env, group))
	defer sub.Close()
	if _, err := sub.Subscribe(t.Context(), "other"); !errors.Is(err, inbox.ErrInvalidArgument) || !strings.Contains(err.Error(), `"other"`) {
		t.Errorf("Subscribe(other) = %v, want an error naming the topic, wrapping ErrInvalidArgument", err)
	}
}

// TestNewRetry_unreachable_brokers_fail_at_setup: one error, naming the
// brokers, not a config error.
func TestNewRetry_unreachable_brokers_fail_at_setup(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = inboxkafka.NewRetry(ctx, inboxkafka.RetryConfig{Brokers: []string{addr}, ConsumerGroup: "g", Topics: []string{"orders"}, SaramaConfig: saramaConfig()})
	if err == nil {
		t.Fatal("NewRetry with no broker listening succeeded")
	}
	if errors.Is(err, inbox.ErrInvalidArgument) || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), addr) || !errors.Is(err, sarama.ErrOutOfBrokers) {
		t.Errorf("NewRetry = %v, want an error naming %s, wrapping sarama.ErrOutOfBrokers", err, addr)
	}
}

// TestNewRetry_without_permission_to_create_fails_at_setup runs kfake with
// ACLs: a user who may describe every topic and group but create none gets
// one error at setup naming the retry topic and the refusal.
func TestNewRetry_without_permission_to_create_fails_at_setup(t *testing.T) {
	t.Parallel()
	all := func(res kmsg.ACLResourceType, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: res, Name: "*", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	env := newKfake(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.Superuser("PLAIN", "admin", "admin"),
		kfake.User("PLAIN", "bob", "bob", all(kmsg.ACLResourceTypeTopic, kmsg.ACLOperationDescribe), all(kmsg.ACLResourceTypeGroup, kmsg.ACLOperationDescribe)),
		kfake.User("PLAIN", "carol", "carol", all(kmsg.ACLResourceTypeTopic, kmsg.ACLOperationDescribe)))
	as := func(user string) *sarama.Config {
		cfg := saramaConfig()
		cfg.Net.SASL.Enable = true
		cfg.Net.SASL.Mechanism = sarama.SASLTypePlaintext
		cfg.Net.SASL.User, cfg.Net.SASL.Password = user, user
		return cfg
	}
	topic, group := names(t)
	admin, err := sarama.NewClusterAdmin(env.brokers, as("admin"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false); err != nil {
		t.Fatal(err)
	}

	cfg := inboxkafka.RetryConfig{Brokers: env.brokers, ConsumerGroup: group, Topics: []string{topic}, SaramaConfig: as("bob")}
	_, err = inboxkafka.NewRetry(t.Context(), cfg)
	if err == nil || !errors.Is(err, sarama.ErrTopicAuthorizationFailed) || !strings.Contains(err.Error(), inboxkafka.DefaultTopicName(topic, group, 250*ms)) {
		t.Fatalf("NewRetry as a user who may not create topics = %v, want an error naming the first retry topic, wrapping ErrTopicAuthorizationFailed", err)
	}
	t.Log(err)

	// The admin creates them; bob's setup then finds them and passes.
	cfg.SaramaConfig = as("admin")
	r, err := inboxkafka.NewRetry(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Close()
	cfg.SaramaConfig = as("bob")
	if r, err = inboxkafka.NewRetry(t.Context(), cfg); err != nil {
		t.Fatalf("NewRetry as a user who may describe the retry topics, once they exist: %v", err)
	}
	_ = r.Close()

	// A user who may not describe the retry consumer group fails too.
	cfg.SaramaConfig = as("carol")
	_, err = inboxkafka.NewRetry(t.Context(), cfg)
	if err == nil || !strings.Contains(err.Error(), strconv.Quote(group+inboxkafka.RetryConsumerGroupSuffix)) {
		t.Fatalf("NewRetry as a user who may not describe groups = %v, want an error naming the retry consumer group", err)
	}
	t.Log(err)
}

// TestNewRetry_sizes_its_topics_and_is_idempotent: retry topics get one
// partition by default (whatever the main topic has), or RetryConfig's
// Partitions, and the main topic's replication factor unless RetryConfig
// says otherwise: a missing main topic without a configured replication
// factor fails at setup naming it; a second setup finds the topics and
// passes.
func TestNewRetry_sizes_its_topics_and_is_idempotent(t *testing.T) {
	t.Parallel()
	eachBroker(t, func(t *testing.T, env kafkaEnv) {
		topic, group := names(t)
		env.createTopic(t, topic, 3)
		ladder := []time.Duration{100 * ms, time.Second}
		r := newRetry(t, env, topic, group, ladder, nil)
		admin := env.admin(t)
		defer admin.Close()
		meta, err := admin.DescribeTopics(r.RetryTopics(topic))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range meta {
			if len(m.Partitions) != inboxkafka.DefaultPartitions {
				t.Errorf("retry topic %s has %d partitions, want %d (the main topic has 3)", m.Name, len(m.Partitions), inboxkafka.DefaultPartitions)
			}
		}
		newRetry(t, env, topic, group, ladder, nil) // again: the topics exist

		missing := topic + "-missing"
		cfg := inboxkafka.RetryConfig{Brokers: env.brokers, ConsumerGroup: group, Topics: []string{missing}, Delays: ladder, SaramaConfig: saramaConfig()}
		cfg.Partitions = 2
		if _, err := inboxkafka.NewRetry(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), strconv.Quote(missing)+" does not exist") {
			t.Errorf("NewRetry for a missing main topic = %v, want an error saying it does not exist", err)
		}
		cfg.ReplicationFactor = 1
		r2, err := inboxkafka.NewRetry(t.Context(), cfg)
		if err != nil {
			t.Fatalf("NewRetry for a missing main topic with a size: %v", err)
		}
		env.deleteAtCleanup(t, r2.RetryTopics(missing), nil)
		defer r2.Close()
		meta, err = admin.DescribeTopics(r2.RetryTopics(missing))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range meta {
			if len(m.Partitions) != 2 {
				t.Errorf("retry topic %s has %d partitions, want 2", m.Name, len(m.Partitions))
			}
		}
	})
}

func TestRetryConfig_Validate_names_each_mistake(t *testing.T) {
	t.Parallel()
	ok := inboxkafka.RetryConfig{Brokers: []string{"localhost:9092"}, ConsumerGroup: "billing", Topics: []string{"orders"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate of a minimal config: %v", err)
	}
	for _, c := range []struct {
		name string
		edit func(*inboxkafka.RetryConfig)
		want string
	}{
		{"no brokers", func(c *inboxkafka.RetryConfig) { c.Brokers = nil }, "Brokers is required"},
		{"empty broker", func(c *inboxkafka.RetryConfig) { c.Brokers = []string{""} }, "Brokers[0] is empty"},
		{"no group", func(c *inboxkafka.RetryConfig) { c.ConsumerGroup = "" }, "ConsumerGroup is required"},
		{"no topics", func(c *inboxkafka.RetryConfig) { c.Topics = nil }, "Topics is required"},
		{"empty topic", func(c *inboxkafka.RetryConfig) { c.Topics = []string{""} }, "Topics[0] is empty"},
		{"topic twice", func(c *inboxkafka.RetryConfig) { c.Topics = []string{"a", "a"} }, `"a" is listed twice`},
		{"decreasing delays", func(c *inboxkafka.RetryConfig) { c.Delays = []time.Duration{time.Second, ms} }, "delays must increase"},
		{"sub-millisecond delay", func(c *inboxkafka.RetryConfig) { c.Delays = []time.Duration{1500 * time.Microsecond} }, "whole number of milliseconds"},
		{"acks", func(c *inboxkafka.RetryConfig) { c.RequiredAcks = 2 }, "RequiredAcks 2"},
		{"partitions", func(c *inboxkafka.RetryConfig) { c.Partitions = -1 }, "Partitions -1 is negative"},
		{"concurrency", func(c *inboxkafka.RetryConfig) { c.Concurrency = -1 }, "Concurrency -1 is negative"},
		{"replication", func(c *inboxkafka.RetryConfig) { c.ReplicationFactor = -1 }, "ReplicationFactor -1 is negative"},
		{"same group", func(c *inboxkafka.RetryConfig) { c.RetryConsumerGroup = "billing" }, "need a consumer group of their own"},
		{"group not fit for a topic name", func(c *inboxkafka.RetryConfig) { c.ConsumerGroup = "billing/eu" }, `"orders.billing/eu.retry-250ms", which holds '/'`},
		{"names that collide", func(c *inboxkafka.RetryConfig) {
			c.TopicName = func(topic, group string, _ time.Duration) string { return topic + "-retry" }
		}, `is named "orders-retry", as the retry topic of "orders", group "billing", delay 250ms is`},
		{"a name that is a main topic", func(c *inboxkafka.RetryConfig) {
			c.Topics = []string{"orders", "orders-retry"}
			c.Delays = []time.Duration{time.Second}
			c.TopicName = func(topic, group string, _ time.Duration) string { return topic + "-retry" }
		}, `is named "orders-retry", as a main topic is`},
		{"sarama", func(c *inboxkafka.RetryConfig) {
			c.SaramaConfig = sarama.NewConfig()
			c.SaramaConfig.Net.MaxOpenRequests = 0
		}, "SaramaConfig: "},
	} {
		cfg := ok
		c.edit(&cfg)
		err := cfg.Validate()
		if !errors.Is(err, inbox.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate() = %v, want an error wrapping ErrInvalidArgument that says %q", c.name, err, c.want)
		}
		if _, err := inboxkafka.NewRetry(t.Context(), cfg); !errors.Is(err, inbox.ErrInvalidArgument) {
			t.Errorf("%s: NewRetry = %v, want the config error", c.name, err)
		}
	}
}
