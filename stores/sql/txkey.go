package sqlstore

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
)

// buildKey makes bus:group:alias:id in the format of package keying: '%' and
// ':' escaped in the first three segments, the id being the IdempotencyKey
// metadata field or else the message UUID, replaced by "~sha256:" and its
// hex SHA-256 when it would make the key invalid or too long.
//
// TODO(sql): use keying.Builder once package keying is on main.
func buildKey(bus, group, alias string, msg *message.Message) (string, error) {
	id := msg.Metadata.Get("IdempotencyKey")
	if id == "" {
		id = msg.UUID
	}
	if id == "" {
		return "", fmt.Errorf("%w: message has neither IdempotencyKey metadata nor a UUID", inbox.ErrNoKey)
	}
	esc := strings.NewReplacer("%", "%25", ":", "%3A")
	prefix := esc.Replace(bus) + ":" + esc.Replace(group) + ":" + esc.Replace(alias) + ":"
	if len(prefix)+len(id) > inbox.MaxKeyLen || !utf8.ValidString(id) || strings.IndexByte(id, 0) >= 0 || strings.HasPrefix(id, "~sha256:") {
		sum := sha256.Sum256([]byte(id))
		id = "~sha256:" + hex.EncodeToString(sum[:])
	}
	key := prefix + id
	if err := inbox.ValidateKey(key); err != nil {
		return "", err
	}
	return key, nil
}
