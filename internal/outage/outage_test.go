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
	p := &Pacer{Backoff: Backoff{Min: 100 * time.Millisecond, Max: 400 * time.Millisecond}}
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
	q := &Pacer{Backoff: Backoff{Min: time.Millisecond, Max: time.Millisecond}}
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
	if w, ok := p.Reserve(far); !ok || w < p.Min/2-time.Millisecond || w > p.Min {
		t.Fatalf("first failure after a recovery: wait %s, want a pause of Min (within [%s, %s])", w, p.Min/2, p.Min)
	}
}

func TestBackoff_pauses_double_within_their_bounds(t *testing.T) {
	t.Parallel()
	b := Backoff{Min: 20 * time.Millisecond, Max: time.Second}
	for n, want := range []time.Duration{20, 40, 80, 160, 320, 640, 1000, 1000} {
		want *= time.Millisecond
		for range 50 {
			if d := b.Pause(n); d < want/2 || d > want {
				t.Fatalf("Pause(%d) = %s, want within [%s, %s]", n, d, want/2, want)
			}
		}
	}
	for _, n := range []int{62, 100, -1} {
		if d := b.Pause(n); d < b.Max/2 || d > b.Max {
			t.Fatalf("Pause(%d) = %s, want within the Max's [%s, %s]", n, d, b.Max/2, b.Max)
		}
	}
}
