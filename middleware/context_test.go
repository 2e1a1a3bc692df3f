package inboxmw_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
	inboxmw "github.com/watermill-inbox/inbox/middleware"
)

// TestHandlerContext_parent_cancel_reaches_a_running_handler checks that the
// message context's cancellation, with its cause, reaches a handler that is
// still running.
func TestHandlerContext_parent_cancel_reaches_a_running_handler(t *testing.T) {
	t.Parallel()
	ib := newInbox(t, inboxmw.Config{Store: newMemory(t), Alias: staticAlias()})
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
	ib := newInbox(t, inboxmw.Config{Store: newMemory(t), Alias: staticAlias()})
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
	ib := newInbox(t, inboxmw.Config{Store: newMemory(t), Alias: staticAlias()})
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

// TestHandler_Goexit_releases_and_goes_on checks that a handler calling
// runtime.Goexit (t.FailNow does) has its lease released before its
// goroutine ends, and is not turned into a panic.
func TestHandler_Goexit_releases_and_goes_on(t *testing.T) {
	t.Parallel()
	store := newMemory(t)
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: keying.StaticAlias("orders-handler")})
	var hctx context.Context
	h := ib.Middleware(func(m *message.Message) ([]*message.Message, error) {
		hctx = m.Context()
		runtime.Goexit()
		return nil, nil
	})
	m := msgFor("goexit")
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		_, _ = h(m)
	}()
	if r := <-done; r != nil {
		t.Fatalf("Goexit in the handler became a panic: %v", r)
	}
	if rec := getRecord(t, store, "goexit"); rec.State != inbox.StateAvailable {
		t.Errorf("after Goexit the key is %v, want Available (released before the goroutine ended)", rec.State)
	}
	if hctx.Err() == nil {
		t.Errorf("the handler's context was not canceled when its goroutine exited")
	}
}
