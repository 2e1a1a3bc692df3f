package keying_test

import (
	"testing"

	"github.com/watermill-inbox/inbox/keying"
)

// The derivation is pinned (the values were computed outside Go, with
// Python's hashlib, from the description in derive.go): a change would make
// every output of a rolling upgrade new work downstream.
func TestDeriveID_is_pinned(t *testing.T) {
	t.Parallel()
	const key = "rabbit:billing:charge:order-42"
	for _, c := range []struct{ domain, name, want string }{
		{keying.OutputDomain, "0", "3495f869-258d-8be6-a323-3fcf937ef3da"},
		{keying.OutputDomain, "1", "364da50b-b014-8315-8f2e-a15980970860"},
		{keying.NamedDomain, "payment", "7ba50bee-01e4-8116-852e-a0b6c25bd74d"},
	} {
		if got := keying.DeriveID(c.domain, key, c.name); got != c.want {
			t.Errorf("DeriveID(%q, %q, %q) = %s, want %s", c.domain, key, c.name, got, c.want)
		}
	}
}
