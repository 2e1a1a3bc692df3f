package outage

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
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
