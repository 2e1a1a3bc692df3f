package keying

import (
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/watermill-inbox/inbox"
)

// AliasFunc returns the alias segment of msg's key: a non-empty name for the
// kind of message, so that two handlers consuming the same message keep
// separate records. It must be safe for concurrent use.
type AliasFunc func(*message.Message) (string, error)

// AliasFromHandler returns an [AliasFunc] that yields the name of the router
// handler consuming msg ([message.HandlerNameFromCtx]); it is the default of
// [Builder.Alias]. A message that did not come through a [message.Router]
// handler has no handler name in its context: the AliasFunc then fails with
// an error wrapping [inbox.ErrInvalidKey] that says how to configure an alias.
func AliasFromHandler() AliasFunc { return aliasFromHandler }

func aliasFromHandler(msg *message.Message) (string, error) {
	if name := message.HandlerNameFromCtx(msg.Context()); name != "" {
		return name, nil
	}
	return "", newError(inbox.ErrInvalidKey,
		"keying: message %s has no handler name in its context, so the alias segment cannot default to it "+
			"(the message was not consumed by a message.Router handler): "+
			`set Builder.Alias, e.g. to keying.StaticAlias("orders") or keying.AliasFromMetadata("type")`,
		quote(msg.UUID))
}

// AliasFromMetadata returns an [AliasFunc] that yields msg's metadata field
// (matched exactly), falling back to the router handler's name, as
// [AliasFromHandler] does, when the field is absent or empty.
func AliasFromMetadata(field string) AliasFunc {
	return func(msg *message.Message) (string, error) {
		if v := msg.Metadata[field]; v != "" {
			return v, nil
		}
		return aliasFromHandler(msg)
	}
}

// StaticAlias returns an [AliasFunc] that always yields alias, for a builder
// that serves a single kind of message or code outside a router. An empty
// alias makes [Builder.Key] fail.
func StaticAlias(alias string) AliasFunc {
	return func(*message.Message) (string, error) { return alias, nil }
}
