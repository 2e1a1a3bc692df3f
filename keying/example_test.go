package keying_test

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
)

func ExampleKey_String() {
	k := keying.Key{Bus: "kafka:prod", Group: "billing", Alias: "InvoiceIssued", ID: "urn:uuid:4b0c9a1e-4c3d-4f6a-9b1e-2d3c4b5a6f70"}
	fmt.Println(k.String())
	// Output:
	// kafka%3Aprod:billing:InvoiceIssued:urn:uuid:4b0c9a1e-4c3d-4f6a-9b1e-2d3c4b5a6f70
}

func ExampleParse() {
	k, err := keying.Parse("rabbit:orders:OrderPlaced%3Av2:urn:uuid:4b0c9a1e-4c3d-4f6a-9b1e-2d3c4b5a6f70")
	if err != nil {
		panic(err)
	}
	fmt.Printf("bus=%s group=%s alias=%s id=%s\n", k.Bus, k.Group, k.Alias, k.ID)

	_, err = keying.Parse("rabbit:orders:OrderPlaced%3av2:1")
	fmt.Println(errors.Is(err, inbox.ErrInvalidKey), err)
	// Output:
	// bus=rabbit group=orders alias=OrderPlaced:v2 id=urn:uuid:4b0c9a1e-4c3d-4f6a-9b1e-2d3c4b5a6f70
	// true keying: alias segment "OrderPlaced%3av2" has the escape "%3a" at byte 11: only %25 (for '%') and %3A (for ':') are allowed
}

func ExampleBuilder_Key() {
	b := &keying.Builder{
		Bus:   "rabbit",
		Group: "orders-service",
		// Inside a message.Router the default alias is the handler's name;
		// this example runs outside one.
		Alias: keying.StaticAlias("OrderPlaced"),
	}
	if err := b.Validate(); err != nil {
		panic(err)
	}

	withKey := message.NewMessage("0d6f1f7e-uuid", nil)
	withKey.Metadata.Set("IdempotencyKey", "order-42")
	withoutKey := message.NewMessage("0d6f1f7e-uuid", nil)
	longKey := message.NewMessage("0d6f1f7e-uuid", nil)
	longKey.Metadata.Set("IdempotencyKey", strings.Repeat("x", 2000))

	for _, msg := range []*message.Message{withKey, withoutKey, longKey} {
		k, source, err := b.Key(msg)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s (id from %s)\n", k, source)
	}

	_, _, err := b.Key(message.NewMessage("", nil))
	fmt.Println(errors.Is(err, inbox.ErrNoKey), err)
	// Output:
	// rabbit:orders-service:OrderPlaced:order-42 (id from metadata:IdempotencyKey)
	// rabbit:orders-service:OrderPlaced:0d6f1f7e-uuid (id from uuid)
	// rabbit:orders-service:OrderPlaced:~sha256:5c0e0ea421571c300b5df6aec0a118b5c3dc02e0683a546341d5efc689df2f58 (id from metadata:IdempotencyKey)
	// true keying: message "" has no id: none of the id sources gave one (tried metadata:IdempotencyKey, uuid)
}

func ExampleBuilder_Prepare() {
	b := keying.Builder{Bus: "kafka:prod", Group: "orders-service", Alias: keying.StaticAlias("OrderPlaced")}
	// Prepare validates b and escapes "kafka:prod" and "orders-service" once;
	// each message then costs only its alias and id.
	keys, err := b.Prepare()
	if err != nil {
		panic(err)
	}
	for _, id := range []string{"order-41", "order-42"} {
		key, source, err := keys.KeyString(message.NewMessage(id, nil))
		if err != nil {
			panic(err)
		}
		fmt.Println(key, source)
	}

	noGroup := keying.Builder{Bus: "kafka:prod"}
	_, err = noGroup.Prepare()
	fmt.Println(errors.Is(err, inbox.ErrInvalidArgument), err)
	// Output:
	// kafka%3Aprod:orders-service:OrderPlaced:order-41 uuid
	// kafka%3Aprod:orders-service:OrderPlaced:order-42 uuid
	// true keying: Builder.Group is empty
}

func ExampleHashID() {
	fmt.Println(keying.HashID("abc"))
	// Output:
	// ~sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad
}
