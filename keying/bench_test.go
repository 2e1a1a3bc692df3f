package keying_test

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/watermill-inbox/inbox/keying"
)

var (
	sinkKey    keying.Key
	sinkString string
)

// benchCases are the messages the key benchmarks run on. The default-alias
// case uses the context a real router gives its messages.
func benchCases(b *testing.B) []struct {
	name string
	b    *keying.Builder
	msg  *message.Message
} {
	ctx := handlerContext(b, "orders-handler")
	routed := message.NewMessage("01J8ZQ6V3M1Q9T5R7X2K4C8D6E", []byte("payload"))
	routed.SetContext(ctx)
	withMeta := message.NewMessage("01J8ZQ6V3M1Q9T5R7X2K4C8D6E", []byte("payload"))
	withMeta.SetContext(ctx)
	withMeta.Metadata.Set("IdempotencyKey", "order-42-placed")
	longID := message.NewMessage("01J8ZQ6V3M1Q9T5R7X2K4C8D6E", []byte("payload"))
	longID.Metadata.Set("IdempotencyKey", strings.Repeat("x", 2000))

	return []struct {
		name string
		b    *keying.Builder
		msg  *message.Message
	}{
		{"uuid/handler-alias", &keying.Builder{Bus: "rabbit", Group: "orders-service"}, routed},
		{"metadata/handler-alias", &keying.Builder{Bus: "rabbit", Group: "orders-service"}, withMeta},
		{"uuid/static-alias", &keying.Builder{Bus: "rabbit", Group: "orders-service", Alias: keying.StaticAlias("OrderPlaced")}, routed},
		{"escaped-bus", &keying.Builder{Bus: "kafka:prod", Group: "orders-service"}, routed},
		{"hashed-2000B-id", &keying.Builder{Bus: "rabbit", Group: "orders-service", Alias: keying.StaticAlias("OrderPlaced")}, longID},
	}
}

func BenchmarkBuilder_Key(b *testing.B) {
	for _, bc := range benchCases(b) {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				k, _, err := bc.b.Key(bc.msg)
				if err != nil {
					b.Fatal(err)
				}
				sinkKey = k
			}
		})
	}
}

// BenchmarkBuilder_Key_String is the key string through Key then String.
func BenchmarkBuilder_Key_String(b *testing.B) {
	for _, bc := range benchCases(b) {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				k, _, err := bc.b.Key(bc.msg)
				if err != nil {
					b.Fatal(err)
				}
				sinkString = k.String()
			}
		})
	}
}

func BenchmarkBuilder_KeyString(b *testing.B) {
	for _, bc := range benchCases(b) {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s, _, err := bc.b.KeyString(bc.msg)
				if err != nil {
					b.Fatal(err)
				}
				sinkString = s
			}
		})
	}
}

// BenchmarkPrepared_KeyString is what the middleware pays for the key
// string: Bus and Group are checked and escaped once, by Prepare.
func BenchmarkPrepared_KeyString(b *testing.B) {
	for _, bc := range benchCases(b) {
		b.Run(bc.name, func(b *testing.B) {
			p, err := bc.b.Prepare()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				s, _, err := p.KeyString(bc.msg)
				if err != nil {
					b.Fatal(err)
				}
				sinkString = s
			}
		})
	}
}

func BenchmarkKey_String(b *testing.B) {
	for _, bc := range []struct {
		name string
		k    keying.Key
	}{
		{"plain", keying.Key{Bus: "rabbit", Group: "orders-service", Alias: "orders-handler", ID: "01J8ZQ6V3M1Q9T5R7X2K4C8D6E"}},
		{"escaped", keying.Key{Bus: "kafka:prod", Group: "orders%service", Alias: "orders:v2", ID: "01J8ZQ6V3M1Q9T5R7X2K4C8D6E"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sinkString = bc.k.String()
			}
		})
	}
}

func BenchmarkParse(b *testing.B) {
	for _, bc := range []struct{ name, s string }{
		{"plain", "rabbit:orders-service:orders-handler:01J8ZQ6V3M1Q9T5R7X2K4C8D6E"},
		{"escaped", "kafka%3Aprod:orders%25service:orders%3Av2:01J8ZQ6V3M1Q9T5R7X2K4C8D6E"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				k, err := keying.Parse(bc.s)
				if err != nil {
					b.Fatal(err)
				}
				sinkKey = k
			}
		})
	}
}
