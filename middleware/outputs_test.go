package inboxmw_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
)

// The derivation is pinned: these values were computed outside Go (Python's
// hashlib) from the description in keying/derive.go, so a change of the
// derivation, which would make every output of a rolling upgrade new work
// downstream, fails here.
func TestOutputID_derivation_is_pinned(t *testing.T) {
	t.Parallel()
	const key = "rabbit:billing:charge:order-42"
	for _, c := range []struct{ got, want string }{
		{inboxmw.OutputID(key, 0), "3495f869-258d-8be6-a323-3fcf937ef3da"},
		{inboxmw.OutputID(key, 1), "364da50b-b014-8315-8f2e-a15980970860"},
		{derivedKeyOf(t, key, "payment"), "7ba50bee-01e4-8116-852e-a0b6c25bd74d"},
	} {
		if c.got != c.want {
			t.Errorf("derived %s, want %s", c.got, c.want)
		}
	}
}

var uuidV8 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestOutputID_is_a_version_8_UUID_distinct_per_key_position_and_name(t *testing.T) {
	t.Parallel()
	seen := map[string]string{}
	add := func(what, id string) {
		t.Helper()
		if !uuidV8.MatchString(id) {
			t.Errorf("%s = %q, not a version 8 UUID", what, id)
		}
		if prev, dup := seen[id]; dup {
			t.Errorf("%s and %s both derive %s", prev, what, id)
		}
		seen[id] = what
	}
	for _, key := range []string{"k:g:a:1", "k:g:a:2", "k:g:b:1", "k:g:a:10"} {
		for pos := range 3 {
			add(fmt.Sprintf("OutputID(%q, %d)", key, pos), inboxmw.OutputID(key, pos))
		}
		for _, name := range []string{"payment", "0", "1", "email"} {
			add(fmt.Sprintf("DerivedKey(%q, %q)", key, name), derivedKeyOf(t, key, name))
		}
	}
	first := inboxmw.OutputID("k:g:a:1", 0)
	if again := inboxmw.OutputID("k:g:a:1", 0); again != first {
		t.Errorf("OutputID gave %s, then %s", first, again)
	}
}

// derivedKeyOf returns DerivedKey(ctx, name) in the handler of a message
// whose inbox key is key (bus:group:alias:id).
func derivedKeyOf(t *testing.T, key, name string) string {
	t.Helper()
	k, err := keying.Parse(key)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inboxmw.New(inboxmw.Config{Store: newMemory(t), Bus: k.Bus, Group: k.Group, Alias: keying.StaticAlias(k.Alias)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ib.Close(context.Background()) }()
	msg := message.NewMessage(watermill.NewUUID(), nil)
	msg.Metadata.Set(keying.DefaultIDMetadataKey, k.ID)
	var got string
	_, err = call(ib, func(m *message.Message) ([]*message.Message, error) {
		if inboxmw.KeyFromCtx(m.Context()) != key {
			t.Fatalf("the handler's key is %q, want %q", inboxmw.KeyFromCtx(m.Context()), key)
		}
		var err error
		got, err = inboxmw.DerivedKey(m.Context(), name)
		return nil, err
	}, msg)
	if err != nil {
		t.Fatal(err)
	}
	msg.Ack()
	return got
}

func TestDerivedKey_outside_a_handler_or_without_a_name_fails(t *testing.T) {
	t.Parallel()
	if _, err := inboxmw.DerivedKey(context.Background(), "payment"); !errors.Is(err, inbox.ErrNoKey) {
		t.Errorf("DerivedKey outside a handler: %v, want ErrNoKey", err)
	}
	ib := newInbox(t, inboxmw.Config{Store: newMemory(t), Alias: staticAlias()})
	_, err := call(ib, func(m *message.Message) ([]*message.Message, error) {
		_, err := inboxmw.DerivedKey(m.Context(), "")
		return nil, err
	}, msgFor("d-1"))
	if !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Errorf("DerivedKey with an empty name: %v, want ErrInvalidArgument", err)
	}
	// A message without an id runs without a key (MissingKeyProcess).
	noID := message.NewMessage("", []byte("x"))
	_, err = call(ib, func(m *message.Message) ([]*message.Message, error) {
		_, err := inboxmw.DerivedKey(m.Context(), "payment")
		return nil, err
	}, noID)
	if !errors.Is(err, inbox.ErrNoKey) {
		t.Errorf("DerivedKey for a message without an id: %v, want ErrNoKey", err)
	}
}

func TestInbox_outputs_get_derived_ids_unless_they_have_a_key(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("KeepOutputIDs=%v", keep), func(t *testing.T) {
			t.Parallel()
			ib := newInbox(t, inboxmw.Config{Store: newMemory(t), Alias: staticAlias(), KeepOutputIDs: keep})
			in := msgFor("o-1")
			inUUID := in.UUID
			keyed := message.NewMessage("keyed-uuid", []byte("keyed"))
			keyed.Metadata.Set(keying.DefaultIDMetadataKey, "my-own-key")
			plain := message.NewMessage("random-uuid", []byte("plain"))
			bare := &message.Message{UUID: "bare-uuid", Payload: []byte("no metadata map")}
			noKey := in.Copy()
			noKey.Metadata = message.Metadata{}
			out, err := call(ib, func(m *message.Message) ([]*message.Message, error) {
				return []*message.Message{plain, keyed, bare}, nil
			}, in)
			if err != nil {
				t.Fatal(err)
			}
			in.Ack()
			if keyed.UUID != "keyed-uuid" || keyed.Metadata.Get(keying.DefaultIDMetadataKey) != "my-own-key" {
				t.Errorf("a message with an IdempotencyKey was changed: UUID %s, key %s", keyed.UUID, keyed.Metadata.Get(keying.DefaultIDMetadataKey))
			}
			if keep {
				if plain.UUID != "random-uuid" || plain.Metadata.Get(keying.DefaultIDMetadataKey) != "" || bare.UUID != "bare-uuid" {
					t.Errorf("KeepOutputIDs: outputs changed: %s %q, %s", plain.UUID, plain.Metadata.Get(keying.DefaultIDMetadataKey), bare.UUID)
				}
				return
			}
			for pos, m := range map[int]*message.Message{0: out[0], 2: out[2]} {
				want := inboxmw.OutputID(testKeyPrefix+"o-1", pos)
				if m.UUID != want || m.Metadata.Get(keying.DefaultIDMetadataKey) != want {
					t.Errorf("output %d: UUID %s, IdempotencyKey %q; want both %s", pos, m.UUID, m.Metadata.Get(keying.DefaultIDMetadataKey), want)
				}
			}
			if in.UUID != inUUID {
				t.Errorf("the input's UUID changed to %s", in.UUID)
			}

			// The input returned as an output (forwarded) is copied, not changed.
			fwd := msgFor("o-2")
			fwd.Metadata = message.Metadata{} // keyed by its UUID
			fwdUUID := fwd.UUID
			out, err = call(ib, func(m *message.Message) ([]*message.Message, error) { return []*message.Message{m}, nil }, fwd)
			if err != nil {
				t.Fatal(err)
			}
			fwd.Ack()
			if out[0] == fwd || fwd.UUID != fwdUUID || fwd.Metadata.Get(keying.DefaultIDMetadataKey) != "" {
				t.Errorf("the forwarded input was changed in place: same %v, UUID %s, key %q", out[0] == fwd, fwd.UUID, fwd.Metadata.Get(keying.DefaultIDMetadataKey))
			}
			if want := inboxmw.OutputID(testKeyPrefix+fwdUUID, 0); out[0].UUID != want || string(out[0].Payload) != string(fwd.Payload) {
				t.Errorf("the forwarded copy: UUID %s, payload %q; want %s and the input's payload", out[0].UUID, out[0].Payload, want)
			}
		})
	}
}

// flakyPublisher passes every message on to the broker, then reports the
// first Publish as failed, as a publish whose confirm was lost does: the
// router nacks, and the handler runs again for the same input. Before it
// reports the failure it calls taken (the next stage handles what the
// broker took).
type flakyPublisher struct {
	message.Publisher
	taken  func()
	failed atomic.Bool
}

func (p *flakyPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	if p.failed.CompareAndSwap(false, true) {
		p.taken()
		return errors.New("publish confirm lost (injected)")
	}
	return nil
}

// A handler that runs twice for one input, its first output published both
// times: with derived ids the next stage applies each output once, the
// first run's message winning at each position, and its PayloadHash check
// reports the position whose payload changed between the runs; with
// KeepOutputIDs it applies all four.
func TestInbox_second_run_outputs_dropped_downstream(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("KeepOutputIDs=%v", keep), func(t *testing.T) {
			t.Parallel()
			ps := newPubSub(t)
			down := newRecorder()
			// The next stage handles the first run's messages before the
			// second run publishes its own (GoChannel, unlike a queue or a
			// partition, does not keep the order of two publishes).
			pub := &flakyPublisher{Publisher: ps, taken: func() {
				// On the router's goroutine: no t.Fatal; the checks below
				// fail if the wait ends without them.
				for deadline := time.Now().Add(10 * time.Second); down.get(inboxmw.OutcomeProcessed) < 2 && time.Now().Before(deadline); {
					time.Sleep(5 * time.Millisecond) // polling interval
				}
			}}
			up := newRecorder()
			ibUp := newInbox(t, inboxmw.Config{Store: newMemory(t), Bus: "test", Group: "up", Metrics: up, KeepOutputIDs: keep, Backoff: inboxmw.ExponentialBackoff(0, 0)})
			var runs atomic.Int32
			startRouter(t, ps, pub, "stage-2", ibUp, func(m *message.Message) ([]*message.Message, error) {
				run := runs.Add(1)
				// The second output depends on the run: an unstable handler.
				return []*message.Message{
					message.NewMessage(watermill.NewUUID(), []byte("invoice")),
					message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "receipt of run %d", run)),
				}, nil
			})

			logs := watermill.NewCaptureLogger()
			ibDown := newInbox(t, inboxmw.Config{Store: newMemory(t), Bus: "test", Group: "down", Metrics: down, PayloadHash: inboxmw.PayloadHashWarn, Logger: logs})
			var mu sync.Mutex
			var applied []string
			startDownstream(t, ps, ibDown, func(m *message.Message) {
				mu.Lock()
				applied = append(applied, string(m.Payload))
				mu.Unlock()
			})

			publish(t, ps, order("o-1"))
			wantHandled := 4
			testenv.Eventually(t, 10*time.Second, "the downstream handled every output", func() bool {
				return down.get(inboxmw.OutcomeProcessed)+down.get(inboxmw.OutcomeDuplicate) == wantHandled
			})
			if runs.Load() != 2 {
				t.Fatalf("upstream handler ran %d times, want 2 (the first publish was reported failed)", runs.Load())
			}
			mu.Lock()
			defer mu.Unlock()
			if keep {
				if len(applied) != 4 || down.get(inboxmw.OutcomeDuplicate) != 0 {
					t.Fatalf("KeepOutputIDs: downstream applied %q, %d duplicates; want all four outputs applied", applied, down.get(inboxmw.OutcomeDuplicate))
				}
				return
			}
			if len(applied) != 2 || down.get(inboxmw.OutcomeDuplicate) != 2 {
				t.Fatalf("downstream applied %q with %d duplicates; want the two outputs of the first run once each, 2 duplicates", applied, down.get(inboxmw.OutcomeDuplicate))
			}
			if fmt.Sprint(applied) != "[invoice receipt of run 1]" && fmt.Sprint(applied) != "[receipt of run 1 invoice]" {
				t.Errorf("downstream applied %q, want the first run's outputs", applied)
			}
			if n := down.get(inboxmw.OutcomePayloadMismatch); n != 1 {
				t.Errorf("payload_mismatch counted %d times downstream, want 1 (the receipt's position)", n)
			}
			if !logged(logs, watermill.ErrorLogLevel, "Known inbox key arrived with a different payload") {
				t.Error("the payload mismatch was not logged downstream")
			}
		})
	}
}

// startDownstream runs a router consuming topic "stage-2" through ib,
// handing each message to apply.
func startDownstream(t *testing.T, sub message.Subscriber, ib *inboxmw.Inbox, apply func(*message.Message)) {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	r.AddMiddleware(ib.Middleware)
	r.AddConsumerHandler("downstream", "stage-2", sub, func(m *message.Message) error {
		apply(m)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Run(ctx); err != nil {
			t.Errorf("router: %v", err)
		}
	}()
	<-r.Running()
	t.Cleanup(func() {
		cancel()
		_ = r.Close()
		<-done
	})
}
