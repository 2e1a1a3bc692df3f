package ladder_test

import (
	"errors"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox/internal/ladder"
)

func TestRound_takes_the_shortest_rung_not_shorter_than_the_wait(t *testing.T) {
	t.Parallel()
	r := []time.Duration{time.Second, 5 * time.Second, time.Minute}
	for _, c := range []struct {
		d    time.Duration
		want int
	}{
		{0, 0}, {time.Millisecond, 0}, {time.Second, 0}, {time.Second + 1, 1}, {5 * time.Second, 1},
		{6 * time.Second, 2}, {time.Minute, 2}, {time.Hour, 2},
	} {
		if got := ladder.Round(r, c.d); got != c.want {
			t.Errorf("Round(%s) = rung %d, want %d", c.d, got, c.want)
		}
	}
}

func TestValidate_names_the_bad_rung(t *testing.T) {
	t.Parallel()
	bad := errors.New("bad")
	if err := ladder.Validate(ladder.Default, bad); err != nil {
		t.Fatalf("Default: %v", err)
	}
	for _, r := range [][]time.Duration{nil, {0}, {time.Microsecond}, {time.Second, time.Second}, {2 * time.Second, time.Second}, {1500 * time.Microsecond}} {
		if err := ladder.Validate(r, bad); !errors.Is(err, bad) {
			t.Errorf("Validate(%v) = %v, want an error wrapping bad", r, err)
		}
	}
}
