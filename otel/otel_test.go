package inboxotel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/otel"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// downStore fails every call while down is set.
type downStore struct {
	*memory.Store
	down bool
}

var errDown = fmt.Errorf("%w: injected", inbox.ErrStoreUnavailable)

func (d *downStore) TryBegin(ctx context.Context, key string, o inbox.BeginOptions) (inbox.Claim, error) {
	if d.down {
		return inbox.Claim{}, errDown
	}
	return d.Store.TryBegin(ctx, key, o)
}

func (d *downStore) Complete(ctx context.Context, key, id string) error {
	if d.down {
		return errDown
	}
	return d.Store.Complete(ctx, key, id)
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

// Every outcome of the claim is a span inbox.claim, child of the message's
// span, with the key's scope, the outcome and the attempt; the store calls
// after the handler have spans of their own; the handler's span gets the
// claim's attributes.
func TestTracer_records_every_outcome(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	mem, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store := &downStore{Store: mem}
	newInbox := func(cfg inboxmw.Config) *inboxmw.Inbox {
		cfg.Store, cfg.Bus, cfg.Group, cfg.Alias, cfg.Tracer = store, "bus", "grp", keying.StaticAlias("h"), inboxotel.New(tp)
		ib, err := inboxmw.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return ib
	}
	ib := newInbox(inboxmw.Config{MaxAttempts: 1, MaxBusyWait: -1})
	parentCtx, parent := tp.Tracer("test").Start(context.Background(), "handler")
	msg := func(id string) *message.Message {
		m := message.NewMessage("uuid-"+id, nil)
		if id != "" {
			m.Metadata.Set("IdempotencyKey", id)
		} else {
			m.UUID = ""
		}
		m.SetContext(parentCtx)
		return m
	}
	okH := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	boom := errors.New("boom")
	failH := func(*message.Message) ([]*message.Message, error) { return nil, boom }

	first := msg("t-ok")
	if _, err := ib.Middleware(okH)(first); err != nil {
		t.Fatal(err)
	}
	first.Ack()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := store.Get(context.Background(), "bus:grp:h:t-ok")
		if err != nil {
			t.Fatal(err)
		}
		if r.State == inbox.StateProcessed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first message was never marked")
		}
		time.Sleep(5 * time.Millisecond)
	}
	_, _ = ib.Middleware(okH)(msg("t-ok")) // duplicate
	if _, err := store.TryBegin(context.Background(), "bus:grp:h:t-busy", inbox.BeginOptions{Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	_, _ = ib.Middleware(okH)(msg("t-busy"))
	_, _ = ib.Middleware(failH)(msg("t-dead")) // fails its only attempt: dead
	_, _ = ib.Middleware(okH)(msg("t-dead"))   // dead at once
	_, _ = ib.Middleware(okH)(msg(""))         // no key
	open := newInbox(inboxmw.Config{FailOpen: true})
	store.down = true
	_, _ = open.Middleware(okH)(msg("t-open"))
	store.down = false
	parent.End()
	if err := ib.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	outcomes := map[string]int{}
	calls := map[string]int{}
	for _, s := range sr.Ended() {
		a := attrs(s)
		switch s.Name() {
		case "inbox.claim":
			if s.Parent().SpanID() != parent.SpanContext().SpanID() {
				t.Errorf("claim span %v is not a child of the handler's span", a)
			}
			o := a["inbox.outcome"].AsString()
			outcomes[o]++
			if o != "no_key" && (a["inbox.bus"].AsString() != "bus" || a["inbox.group"].AsString() != "grp" ||
				a["inbox.alias"].AsString() != "h" || a["inbox.key"].AsString() == "") {
				t.Errorf("claim span with outcome %s lacks the key's scope: %v", o, a)
			}
			if _, ok := a["inbox.attempt"]; !ok {
				t.Errorf("claim span with outcome %s lacks the attempt", o)
			}
			if o == "dead" && a["inbox.attempt"].AsInt64() != 1 {
				t.Errorf("dead claim's attempt %d, want 1", a["inbox.attempt"].AsInt64())
			}
		case "handler":
			if _, ok := a["inbox.outcome"]; !ok {
				t.Errorf("the handler's span has no inbox attributes: %v", a)
			}
		default:
			calls[s.Name()]++
			if s.Name() == "inbox.fail" && s.Status().Code != codes.Unset {
				t.Errorf("the Fail that landed has status %v", s.Status())
			}
		}
	}
	for _, o := range []string{"acquired", "duplicate", "busy", "dead", "fail_open", "no_key"} {
		if outcomes[o] == 0 {
			t.Errorf("no claim span with outcome %q; got %v", o, outcomes)
		}
	}
	if calls["inbox.complete"] != 1 || calls["inbox.fail"] != 1 {
		t.Errorf("store call spans %v, want one inbox.complete and one inbox.fail", calls)
	}
}
