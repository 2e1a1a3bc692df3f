package inboxamqp

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
)

// DefaultMessageIDKey is the metadata field that [Marshaler] copies the AMQP
// message-id property into, and that [FromMessageID] reads, unless
// [Marshaler.MessageIDKey] names another.
const DefaultMessageIDKey = "amqp_message_id"

// SourceName is the name of the [keying.IDSource] that [FromMessageID]
// returns, as it appears in logs and metrics.
const SourceName = "amqp-message-id"

// MaxMessageIDLen is the longest AMQP message-id property, in bytes: it is a
// short string on the wire. Marshal replaces a longer id by
// [keying.HashID] of it, because the AMQP client would silently cut it.
const MaxMessageIDLen = 255

// Marshaler is an [amqp.Marshaler] for watermill-amqp/v2 that accepts headers
// of every AMQP type and carries the message-id property. Its zero value is
// ready to use. See the package documentation.
type Marshaler struct {
	// DefaultMarshaler does the rest of the work: body, delivery mode, the
	// Watermill UUID header, PostprocessPublishing. Optional; the zero value
	// is watermill-amqp's defaults (persistent delivery).
	DefaultMarshaler amqp.DefaultMarshaler

	// MessageIDKey is the metadata field that Unmarshal copies the delivery's
	// message-id property into. Optional; default [DefaultMessageIDKey]. A
	// header of that name is overwritten, or removed when the delivery has no
	// message-id, so the field only ever holds the property. Marshal never
	// sends it as a header. Use [keying.FromMetadata] with the same name when
	// you change it.
	MessageIDKey string

	// IDKeys are the metadata fields Marshal takes the message-id property
	// from, the first non-empty one winning; when all are empty, the message
	// UUID is used. Optional; default [keying.DefaultIDMetadataKey]
	// ("IdempotencyKey"). A message-id that PostprocessPublishing sets is kept.
	IDKeys []string
}

var _ amqp.Marshaler = Marshaler{}

func (m Marshaler) messageIDKey() string {
	if m.MessageIDKey != "" {
		return m.MessageIDKey
	}
	return DefaultMessageIDKey
}

// Marshal is DefaultMarshaler's Marshal that also sets the message-id
// property (see [Marshaler.IDKeys]), unless PostprocessPublishing set one. An
// id longer than [MaxMessageIDLen] bytes is replaced by [keying.HashID] of
// it. It sets the timestamp property too, unless PostprocessPublishing set
// one: from the metadata field [TimestampKey] of a message consumed through
// Marshaler (a republished copy keeps its producer's time), else the time
// of publishing.
func (m Marshaler) Marshal(msg *message.Message) (amqp091.Publishing, error) {
	p, err := m.DefaultMarshaler.Marshal(msg)
	if err != nil {
		return p, err
	}
	delete(p.Headers, m.messageIDKey())
	stampPublishing(&p, msg)
	if p.MessageId == "" {
		p.MessageId = m.publishID(msg)
	}
	if len(p.MessageId) > MaxMessageIDLen {
		p.MessageId = keying.HashID(p.MessageId)
	}
	return p, nil
}

func (m Marshaler) publishID(msg *message.Message) string {
	keys := m.IDKeys
	if len(keys) == 0 {
		keys = []string{keying.DefaultIDMetadataKey}
	}
	for _, k := range keys {
		if v := msg.Metadata.Get(k); v != "" {
			return v
		}
	}
	return msg.UUID
}

// Unmarshal turns every header into a string (see the package
// documentation), lets DefaultMarshaler build the message, then sets the
// metadata field [Marshaler.MessageIDKey] to the delivery's message-id
// property, and [TimestampKey] to its timestamp property. It fails only where DefaultMarshaler would on string headers.
// The delivery's own header table is not modified.
func (m Marshaler) Unmarshal(d amqp091.Delivery) (*message.Message, error) {
	if !allStrings(d.Headers) {
		headers := make(amqp091.Table, len(d.Headers))
		for k, v := range d.Headers {
			s, err := HeaderString(v)
			if err != nil {
				return nil, fmt.Errorf("header %q: %w", k, err)
			}
			headers[k] = s
		}
		d.Headers = headers
	}
	msg, err := m.DefaultMarshaler.Unmarshal(d)
	if err != nil {
		return nil, err
	}
	if d.MessageId != "" {
		msg.Metadata.Set(m.messageIDKey(), d.MessageId)
	} else {
		delete(msg.Metadata, m.messageIDKey())
	}
	stampDelivery(msg, d)
	return msg, nil
}

// allStrings reports whether every value of t is a string: then
// DefaultMarshaler can read t as it is, without a copy.
func allStrings(t amqp091.Table) bool {
	for _, v := range t {
		if _, ok := v.(string); !ok {
			return false
		}
	}
	return true
}

// FromMessageID returns a [keying.IDSource] named [SourceName] that yields
// the AMQP message-id property, as [Marshaler] copied it into the metadata
// field [DefaultMessageIDKey]. It yields "" for a delivery without a
// message-id. With another [Marshaler.MessageIDKey], use
// [keying.FromMetadata] with that name instead.
func FromMessageID() keying.IDSource {
	return keying.IDSourceFunc(SourceName, func(msg *message.Message) (string, error) {
		return msg.Metadata[DefaultMessageIDKey], nil
	})
}

// HeaderString returns the string [Marshaler] puts in the metadata for the
// AMQP header value v (see the package documentation for the rules). The
// error is for Go types that AMQP 0-9-1 has no field type for, which a
// delivery never holds.
func HeaderString(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case nil:
		return "", nil
	case bool:
		return strconv.FormatBool(v), nil
	case int8:
		return strconv.FormatInt(int64(v), 10), nil
	case int16:
		return strconv.FormatInt(int64(v), 10), nil
	case int32:
		return strconv.FormatInt(int64(v), 10), nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case int:
		return strconv.FormatInt(int64(v), 10), nil
	case uint8:
		return strconv.FormatUint(uint64(v), 10), nil
	case uint16:
		return strconv.FormatUint(uint64(v), 10), nil
	case uint32:
		return strconv.FormatUint(uint64(v), 10), nil
	case uint64:
		return strconv.FormatUint(v, 10), nil
	case float32:
		return formatFloat(float64(v), 32), nil
	case float64:
		return formatFloat(v, 64), nil
	case amqp091.Decimal:
		return formatDecimal(v), nil
	case []byte:
		return base64.StdEncoding.EncodeToString(v), nil
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano), nil
	case amqp091.Table, []any:
		j, err := jsonValue(v)
		if err != nil {
			return "", err
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(j); err != nil {
			return "", fmt.Errorf("%w (%v)", errUnsupported, err)
		}
		return string(bytes.TrimSuffix(buf.Bytes(), []byte("\n"))), nil
	default:
		return "", fmt.Errorf("%w: %T", errUnsupported, v)
	}
}

var errUnsupported = fmt.Errorf("%w: inboxamqp: a value of a Go type that AMQP 0-9-1 has no field type for", inbox.ErrInvalidArgument)

// jsonValue maps an AMQP field value to what encoding/json writes as the
// rules of the package documentation ask.
func jsonValue(v any) (any, error) {
	switch v := v.(type) {
	case amqp091.Table:
		out := make(map[string]any, len(v))
		for k, e := range v {
			j, err := jsonValue(e)
			if err != nil {
				return nil, fmt.Errorf("table field %q: %w", k, err)
			}
			out[k] = j
		}
		return out, nil
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			j, err := jsonValue(e)
			if err != nil {
				return nil, fmt.Errorf("array index %d: %w", i, err)
			}
			out[i] = j
		}
		return out, nil
	case nil, bool, string, int8, int16, int32, int64, int, uint8, uint16, uint32, uint64:
		return v, nil
	case float32:
		if f := float64(v); math.IsNaN(f) || math.IsInf(f, 0) {
			return formatFloat(f, 32), nil
		}
		return json.Number(formatFloat(float64(v), 32)), nil
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return formatFloat(v, 64), nil
		}
		return json.Number(formatFloat(v, 64)), nil
	default:
		return HeaderString(v)
	}
}

func formatFloat(f float64, bits int) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, bits)
}

// formatDecimal writes Value / 10^Scale exactly.
func formatDecimal(d amqp091.Decimal) string {
	r := new(big.Rat).SetFrac(big.NewInt(int64(d.Value)), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(d.Scale)), nil))
	return r.FloatString(int(d.Scale))
}
