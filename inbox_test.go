package inbox_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/watermill-inbox/inbox"
)

func TestStatus_round_trip(t *testing.T) {
	t.Parallel()
	for _, s := range []inbox.Status{inbox.Acquired, inbox.Processed, inbox.Busy} {
		got, err := inbox.ParseStatus(s.String())
		if err != nil || got != s {
			t.Errorf("ParseStatus(%q) = %v, %v", s.String(), got, err)
		}
	}
	if _, err := inbox.ParseStatus("Done"); !errors.Is(err, inbox.ErrInvalidArgument) || !strings.Contains(err.Error(), `"Done"`) {
		t.Errorf("unknown status: %v", err)
	}
	if _, err := inbox.ParseStatus(""); err == nil {
		t.Error("empty status parsed")
	}
	if s := inbox.Status(0).String(); s != "Status(0)" {
		t.Errorf("zero status prints %q", s)
	}
}

func TestState_round_trip(t *testing.T) {
	t.Parallel()
	for _, s := range []inbox.State{inbox.StateNotFound, inbox.StateAvailable, inbox.StateInProgress, inbox.StateProcessed} {
		got, err := inbox.ParseState(s.String())
		if err != nil || got != s {
			t.Errorf("ParseState(%q) = %v, %v", s.String(), got, err)
		}
	}
	if _, err := inbox.ParseState("Gone"); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Errorf("unknown state: %v", err)
	}
}

func TestValidateKey(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"a", "bus:group:alias:urn:uuid:1", "ключ", strings.Repeat("x", inbox.MaxKeyLen)} {
		if err := inbox.ValidateKey(ok); err != nil {
			t.Errorf("ValidateKey(%.20q): %v", ok, err)
		}
	}
	for name, bad := range map[string]string{
		"empty":   "",
		"long":    strings.Repeat("x", inbox.MaxKeyLen+1),
		"utf8":    "a\xffb",
		"nul":     "a\x00b",
		"trunc":   "\xe2\x82",
		"onlynul": "\x00",
	} {
		err := inbox.ValidateKey(bad)
		if !errors.Is(err, inbox.ErrInvalidKey) || !errors.Is(err, inbox.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidKey", name, err)
		}
	}
}

func TestBeginOptions_Validate(t *testing.T) {
	t.Parallel()
	if err := (inbox.BeginOptions{}).Validate(); err != nil {
		t.Fatalf("zero options: %v", err)
	}
	cases := map[string]struct {
		o    inbox.BeginOptions
		want error
	}{
		"negative lease": {inbox.BeginOptions{Lease: -time.Second}, inbox.ErrInvalidLease},
		"long lease id":  {inbox.BeginOptions{LeaseID: strings.Repeat("i", inbox.MaxLeaseIDLen+1)}, inbox.ErrInvalidLeaseID},
		"nul lease id":   {inbox.BeginOptions{LeaseID: "a\x00"}, inbox.ErrInvalidLeaseID},
		"long owner":     {inbox.BeginOptions{Owner: strings.Repeat("o", inbox.MaxOwnerLen+1)}, inbox.ErrInvalidArgument},
		"bad owner utf8": {inbox.BeginOptions{Owner: "\xff"}, inbox.ErrInvalidArgument},
		"long hash":      {inbox.BeginOptions{PayloadHash: strings.Repeat("h", inbox.MaxPayloadHashLen+1)}, inbox.ErrInvalidArgument},
	}
	for name, c := range cases {
		if err := c.o.Validate(); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

func TestValidateLease(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{0, -1} {
		if err := inbox.ValidateLease(d); !errors.Is(err, inbox.ErrInvalidLease) {
			t.Errorf("ValidateLease(%s) = %v", d, err)
		}
	}
	if err := inbox.ValidateLease(time.Nanosecond); err != nil {
		t.Error(err)
	}
}

func TestNewLeaseID(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		id := inbox.NewLeaseID()
		if len(id) != 32 || seen[id] || inbox.ValidateLeaseID(id) != nil {
			t.Fatalf("lease id %q: want 32 hex digits, unique and valid", id)
		}
		seen[id] = true
	}
}

func TestBusyError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  inbox.BusyError
		want string
	}{
		{inbox.BusyError{Key: "k", RetryAfter: time.Second}, `inbox: key "k" busy: another consumer holds its lease for 1s more`},
		{inbox.BusyError{Key: "k", RetryAfter: 2 * time.Second, BackingOff: true}, `inbox: key "k" busy: it is waiting out a failed attempt's backoff for 2s more`},
		{inbox.BusyError{Key: "k"}, `inbox: key "k" busy: another consumer holds its lease`},
	} {
		err := error(&tc.err)
		if !errors.Is(err, inbox.ErrBusy) || err.Error() != tc.want {
			t.Errorf("BusyError %+v: %q (matches ErrBusy: %v); want %q, matching ErrBusy", tc.err, err, errors.Is(err, inbox.ErrBusy), tc.want)
		}
	}
}

// The validators check ASCII eight bytes at a time: every position of a
// NUL or a non-ASCII byte, in strings of every length around the word size,
// must give the verdict of utf8.ValidString and strings.IndexByte.
func TestValidateKey_word_boundaries(t *testing.T) {
	t.Parallel()
	for n := 1; n <= 40; n++ {
		for pos := 0; pos < n; pos++ {
			for _, ins := range []string{"\x00", "\x7f", "\x80", "\xff", "é", "€", "\xe2\x82", "\x01"} {
				b := []byte(strings.Repeat("k", n))
				s := string(b[:pos]) + ins + string(b[pos+1:])
				want := utf8.ValidString(s) && !strings.Contains(s, "\x00")
				if got := inbox.ValidateKey(s) == nil; got != want {
					t.Errorf("ValidateKey(%q) valid = %v, want %v", s, got, want)
				}
				if len(s) <= inbox.MaxLeaseIDLen {
					if got := inbox.ValidateLeaseID(s) == nil; got != want {
						t.Errorf("ValidateLeaseID(%q) valid = %v, want %v", s, got, want)
					}
				}
				if got := (inbox.BeginOptions{Owner: s}).Validate() == nil; got != want {
					t.Errorf("Owner %q valid = %v, want %v", s, got, want)
				}
			}
		}
	}
}

func TestValidateHolder(t *testing.T) {
	t.Parallel()
	if err := inbox.ValidateHolder("bus:group:alias:id", "lease-1"); err != nil {
		t.Fatalf("valid arguments: %v", err)
	}
	if err := inbox.ValidateHolder("", "lease-1"); !errors.Is(err, inbox.ErrInvalidKey) {
		t.Fatalf("empty key: %v, want ErrInvalidKey", err)
	}
	if err := inbox.ValidateHolder("k", ""); !errors.Is(err, inbox.ErrInvalidLeaseID) {
		t.Fatalf("empty lease id: %v, want ErrInvalidLeaseID", err)
	}
	if err := inbox.ValidateHolder("bad\x00key", "bad\x00id"); !errors.Is(err, inbox.ErrInvalidKey) {
		t.Fatalf("both bad: %v, want the key's error first", err)
	}
}

func TestPermanent_matches_the_sentinel_and_the_wrapped_error(t *testing.T) {
	t.Parallel()
	if inbox.Permanent(nil) != nil {
		t.Fatal("Permanent(nil) is not nil")
	}
	cause := errors.New("order has no customer")
	err := fmt.Errorf("charge: %w", inbox.Permanent(cause))
	if !errors.Is(err, inbox.ErrPermanent) || !errors.Is(err, cause) {
		t.Fatalf("%v: errors.Is ErrPermanent %v, cause %v", err, errors.Is(err, inbox.ErrPermanent), errors.Is(err, cause))
	}
	var pe *inbox.PermanentError
	if !errors.As(err, &pe) || pe.Err != cause {
		t.Fatalf("errors.As: %v", pe)
	}
	if err.Error() != "charge: order has no customer" {
		t.Fatalf("Error() = %q", err.Error())
	}
	if errors.Is(cause, inbox.ErrPermanent) {
		t.Fatal("an unwrapped error is permanent")
	}
}
