package inboxmw

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/internal/testenv"
)

// countingCtx is a cancelable message context that counts the functions
// registered on it (through AfterFunc: it hides the cancelCtx it wraps, so
// children and context.AfterFunc register through its AfterFunc method), so
// a test can see whether handler contexts register and unregister.
type countingCtx struct {
	inner context.Context
	mu    sync.Mutex
	live  int
	seen  int
}

func (c *countingCtx) Deadline() (time.Time, bool) { return c.inner.Deadline() }
func (c *countingCtx) Done() <-chan struct{}       { return c.inner.Done() }
func (c *countingCtx) Err() error                  { return c.inner.Err() }
func (c *countingCtx) Value(any) any               { return nil }

func (c *countingCtx) AfterFunc(f func()) func() bool {
	c.mu.Lock()
	c.live++
	c.seen++
	c.mu.Unlock()
	stop := context.AfterFunc(c.inner, f)
	var once sync.Once
	return func() bool {
		stopped := stop()
		once.Do(func() { c.mu.Lock(); c.live--; c.mu.Unlock() })
		return stopped
	}
}

func (c *countingCtx) counts() (live, seen int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live, c.seen
}

// TestHandlerContext_parent_cancel_reaches_a_running_handler checks that the
// message context's cancellation, with its cause, reaches a handler that is
// still running.
func TestHandlerContext_parent_cancel_reaches_a_running_handler(t *testing.T) {
	t.Parallel()
	ib, _ := newInlineInbox(t)
	defer func() { _ = ib.Close(context.Background()) }()
	cause := errors.New("subscriber closing")
	mctx, cancel := context.WithCancelCause(context.WithValue(context.Background(), ctxKey{}, "v"))
	started := make(chan struct{})
	var gotErr, gotCause error
	var gotValue any
	h := ib.Middleware(func(m *message.Message) ([]*message.Message, error) {
		close(started)
		gotValue = m.Context().Value(ctxKey{})
		select {
		case <-m.Context().Done():
		case <-time.After(10 * time.Second):
		}
		gotErr, gotCause = m.Context().Err(), context.Cause(m.Context())
		return nil, gotErr
	})
	m := message.NewMessage("1", nil)
	m.SetContext(mctx)
	done := make(chan struct{})
	go func() { defer close(done); _, _ = h(m) }()
	<-started
	cancel(cause)
	<-done
	if gotValue != "v" {
		t.Errorf("handler saw value %v, want the message context's", gotValue)
	}
	if !errors.Is(gotErr, context.Canceled) || gotCause != cause {
		t.Errorf("handler context: Err %v, Cause %v; want context.Canceled and the message context's cause", gotErr, gotCause)
	}
}

type ctxKey struct{}

// TestHandlerContext_parent_deadline checks that a deadline set on the
// message context outside the middleware is the handler's at once, and
// ends it with context.DeadlineExceeded.
func TestHandlerContext_parent_deadline(t *testing.T) {
	t.Parallel()
	ib, _ := newInlineInbox(t)
	defer func() { _ = ib.Close(context.Background()) }()
	mctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	want, _ := mctx.Deadline()
	var got time.Time
	var ok bool
	var err error
	h := ib.Middleware(func(m *message.Message) ([]*message.Message, error) {
		got, ok = m.Context().Deadline()
		select {
		case <-m.Context().Done():
		case <-time.After(10 * time.Second):
		}
		err = m.Context().Err()
		return nil, err
	})
	m := message.NewMessage("1", nil)
	m.SetContext(mctx)
	_, _ = h(m)
	if !ok || !got.Equal(want) {
		t.Errorf("handler's deadline %v (%v), want the message context's %v", got, ok, want)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("handler context ended with %v, want context.DeadlineExceeded", err)
	}
}

// TestHandlerContext_parent_done_before_the_handler checks that a message
// context done before the handler starts gives a handler context done from
// the start.
func TestHandlerContext_parent_done_before_the_handler(t *testing.T) {
	t.Parallel()
	ib, _ := newInlineInbox(t)
	defer func() { _ = ib.Close(context.Background()) }()
	cause := errors.New("gone")
	mctx, cancel := context.WithCancelCause(context.Background())
	var errAtStart, causeAtStart error
	h := ib.Middleware(func(m *message.Message) ([]*message.Message, error) {
		errAtStart, causeAtStart = m.Context().Err(), context.Cause(m.Context())
		return nil, nil
	})
	m := message.NewMessage("1", nil)
	m.SetContext(mctx)
	m.Ack() // acked before the handler, whose claim then does not depend on the context
	cancel(cause)
	if _, err := h(m); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(errAtStart, context.Canceled) || causeAtStart != cause {
		t.Errorf("handler context at start: Err %v, Cause %v; want canceled with the message context's cause", errAtStart, causeAtStart)
	}
}

// TestHandlerContext_not_left_registered checks that handlers' contexts do
// not stay registered with the message context: quick handlers never
// register, and one that ran past linkAfter unregisters when its lease ends.
func TestHandlerContext_not_left_registered(t *testing.T) {
	t.Parallel()
	ib, _ := newInlineInbox(t)
	inner, cancel := context.WithCancel(context.Background())
	defer cancel()
	mctx := &countingCtx{inner: inner}
	slow := ""
	h := ib.Middleware(func(m *message.Message) ([]*message.Message, error) {
		if m.UUID == slow {
			testenv.Eventually(t, 10*time.Second, "the slow handler's context is linked", func() bool {
				live, _ := mctx.counts()
				return live == 1
			})
		}
		return nil, nil
	})
	for _, id := range []string{"q1", "q2", "q3"} {
		m := message.NewMessage(id, nil)
		m.SetContext(mctx)
		if _, err := h(m); err != nil {
			t.Fatal(err)
		}
		m.Ack()
		if _, seen := mctx.counts(); seen != 0 {
			t.Fatalf("quick handler %s registered with the message context", id)
		}
	}
	slow = "slow"
	m := message.NewMessage(slow, nil)
	m.SetContext(mctx)
	if _, err := h(m); err != nil {
		t.Fatal(err)
	}
	m.Ack()
	if err := ib.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if live, seen := mctx.counts(); live != 0 || seen != 1 {
		t.Errorf("after the slow handler's lease: %d live registrations of %d, want 0 of 1", live, seen)
	}
}
