package outage

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/internal/testenv"
)

func TestLog_one_line_per_interval_then_recovery(t *testing.T) {
	t.Parallel()
	logs := watermill.NewCaptureLogger()
	l := NewLog(logs, "recovered")
	l.every = time.Hour
	down := errors.New("down")
	for range 100 {
		l.Fail("failed", down, nil)
	}
	if errs := logs.Captured()[watermill.ErrorLogLevel]; len(errs) != 1 || errs[0].Err != down {
		t.Fatalf("%d lines for 100 failures within the interval, want 1 with the cause", len(errs))
	}
	l.every = 0 // the interval has passed: the next failure logs with the count
	l.Fail("failed", down, nil)
	errs := logs.Captured()[watermill.ErrorLogLevel]
	if len(errs) != 2 || errs[1].Fields["failures_not_logged"] != 99 {
		t.Fatalf("second line %v, want one saying 99 failures were not logged", errs)
	}
	l.OK()
	l.OK()
	infos := logs.Captured()[watermill.InfoLogLevel]
	if len(infos) != 1 || infos[0].Msg != "recovered" || infos[0].Fields["failures"] != 101 {
		t.Fatalf("recovery lines %v, want one counting 101 failures", infos)
	}
	l.every = time.Hour
	l.Fail("failed again", down, nil)
	if errs := logs.Captured()[watermill.ErrorLogLevel]; len(errs) != 3 {
		t.Fatalf("a new outage's first failure was not logged: %d lines", len(errs))
	}
}

func TestPacer_spaces_calls_across_callers(t *testing.T) {
	t.Parallel()
	p := &Pacer{Min: 100 * time.Millisecond, Max: 400 * time.Millisecond}
	far := time.Now().Add(time.Hour)
	if w, ok := p.Reserve(far); w != 0 || !ok {
		t.Fatalf("no outage: wait %s, %v; want 0, true", w, ok)
	}
	for range 5 {
		p.Failed()
	}
	// Pause at Max (jittered to [200, 400] ms): ten callers get slots one
	// pause apart, the first within one pause.
	var prev time.Duration
	for i := range 10 {
		w, ok := p.Reserve(far)
		if !ok || w > time.Duration(i+1)*400*time.Millisecond || (i > 0 && w-prev < 200*time.Millisecond-time.Millisecond) {
			t.Fatalf("caller %d: wait %s (previous %s), %v; want slots 200 to 400 ms apart", i, w, prev, ok)
		}
		prev = w
	}
	if _, ok := p.Reserve(time.Now().Add(time.Second)); ok {
		t.Fatal("a slot beyond the caller's deadline was reserved")
	}
	// A caller that cannot wait (deadline in the past) gets a slot that is
	// free now.
	q := &Pacer{Min: time.Millisecond, Max: time.Millisecond}
	q.Failed()
	testenv.Eventually(t, 5*time.Second, "a slot granted to a caller past its deadline", func() bool {
		_, ok := q.Reserve(time.Now().Add(-time.Second))
		return ok
	})
	p.OK()
	if w, ok := p.Reserve(far); w != 0 || !ok {
		t.Fatalf("after recovery: wait %s, %v; want 0, true", w, ok)
	}
	p.Failed()
	if p.pause != p.Min {
		t.Fatalf("first failure after a recovery: pause %s, want Min", p.pause)
	}
}
