package inboxamqp_test

import (
	"encoding/base64"
	"math"
	"testing"
	"unicode/utf8"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox/amqp"
)

// FuzzHeaderString checks that every value a delivery can carry converts
// without error, deterministically, to valid UTF-8 when the input is text or
// bytes, and that bytes come back from base64.
func FuzzHeaderString(f *testing.F) {
	f.Add("text", []byte{0xff, 0x00}, int64(-1), 1.5, uint8(2), int32(7), true)
	f.Add("", []byte{}, int64(math.MaxInt64), math.Inf(-1), uint8(0), int32(-1), false)
	f.Fuzz(func(t *testing.T, s string, b []byte, i int64, fl float64, scale uint8, dv int32, bo bool) {
		values := []any{s, b, i, fl, float32(fl), bo, int8(i), int16(i), int32(i), uint8(i), uint16(i), uint32(i), uint64(i),
			amqp091.Decimal{Scale: scale, Value: dv}, nil}
		table := amqp091.Table{s: b, "i": i, "f": fl, "list": []any{s, b, i, fl, bo, amqp091.Decimal{Scale: scale, Value: dv}}}
		values = append(values, table, []any{table, values[0]})
		for _, v := range values {
			got, err := inboxamqp.HeaderString(v)
			if err != nil {
				t.Fatalf("HeaderString(%#v): %v", v, err)
			}
			again, _ := inboxamqp.HeaderString(v)
			if got != again {
				t.Fatalf("HeaderString(%#v) gave %q then %q", v, got, again)
			}
			if _, isStr := v.(string); !isStr && !utf8.ValidString(got) {
				t.Fatalf("HeaderString(%#v) = %q is not valid UTF-8", v, got)
			}
		}
		got, _ := inboxamqp.HeaderString(b)
		if back, err := base64.StdEncoding.DecodeString(got); err != nil || string(back) != string(b) {
			t.Fatalf("bytes %x gave %q, which does not decode back (%v)", b, got, err)
		}
	})
}
