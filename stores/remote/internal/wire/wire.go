// Package wire holds the JSON shapes, names and key escaping of the remote
// inbox protocol v1, shared by the client (package remote) and the reference
// server (package remote/server). The protocol itself is documented in
// stores/remote/openapi.yaml and in the package documentation of remote.
package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Version is the protocol version in paths and in the discovery document.
const Version = "v1"

// Paths of the protocol, relative to the service's base URL.
const (
	Discovery     = "/v1/inbox"
	KeyPrefix     = "/v1/inbox/"
	TryBegin      = "/v1/inbox/try-begin"
	MarkProcessed = "/v1/inbox/mark-processed"
	Release       = "/v1/inbox/release"
	Extend        = "/v1/inbox/extend"
	Fail          = "/v1/inbox/fail"          // ext. "fail"
	List          = "/v1/inbox/list"          // ext. "admin"
	Forget        = "/v1/inbox/forget"        // ext. "admin"
	ForceRelease  = "/v1/inbox/force-release" // ext. "admin"
)

// CheckKey is the key a client reads (GET) to check that the service
// accepts its token and that the service's store answers. Every consumer
// token may read it, whatever key prefixes limit the token; writing it
// needs the right to, as for any key.
const CheckKey = "inbox-remote:check"

// AcceptDeadQuery is the query of GET /v1/inbox/{key} with which a client
// says that it reads the status Dead (ext. "fail").
const AcceptDeadQuery = "acceptDead=true"

// Statuses of 200 answers.
const (
	StatusAcquired   = "Acquired"
	StatusProcessed  = "Processed"
	StatusBusy       = "Busy"
	StatusLeaseLost  = "LeaseLost"
	StatusReleased   = "Released"
	StatusExtended   = "Extended"
	StatusNotFound   = "NotFound"
	StatusAvailable  = "Available"
	StatusInProgress = "InProgress"
	StatusDead       = "Dead"      // ext. "fail": try-begin, fail, GET, list
	StatusForgotten  = "Forgotten" // ext. "admin": forget
)

// Auth modes and lease policies of the discovery document.
const (
	AuthNone   = "none"
	AuthBearer = "bearer"

	PolicyClamp  = "clamp"
	PolicyReject = "reject"
)

// Extensions a server lists in its discovery document.
const (
	ExtExtend          = "extend"          // POST /v1/inbox/extend
	ExtLeaseID         = "leaseId"         // try-begin honours the caller's leaseId
	ExtPayloadHash     = "payloadHash"     // try-begin records payloadHash; GET returns it
	ExtPayloadMismatch = "payloadMismatch" // try-begin answers payloadMismatch
	// ExtFail: POST /v1/inbox/fail; try-begin answers attempts, backoff
	// with Busy, and Dead (with reason) to a request with acceptDead; GET
	// answers reason and retryAt, and Dead with ?acceptDead=true.
	ExtFail = "fail"
	// ExtAdmin: POST /v1/inbox/list, forget and force-release.
	ExtAdmin = "admin"
)

// Extensions is what this project's server lists, in this order, over a
// store that implements inbox.Admin; without it, the server leaves ExtAdmin
// out.
var Extensions = []string{ExtExtend, ExtLeaseID, ExtPayloadHash, ExtPayloadMismatch, ExtFail, ExtAdmin}

// Error codes of 4xx and 5xx answers.
const (
	CodeInvalidJSON      = "invalid_json"
	CodeInvalidKey       = "invalid_key"
	CodeInvalidLease     = "invalid_lease"
	CodeInvalidLeaseID   = "invalid_lease_id"
	CodeInvalidArgument  = "invalid_argument"
	CodeBodyTooLarge     = "body_too_large"
	CodeUnauthorized     = "unauthorized"
	CodeForbidden        = "forbidden"              // 403: the token may not make this call, or a browser's request to a server without tokens
	CodeUnsupportedMedia = "unsupported_media_type" // 415: a POST that is not application/json
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeNotSupported     = "not_supported"
	CodeStoreUnavailable = "store_unavailable"
	CodeInternal         = "internal_error"
	CodeDraining         = "draining" // /readyz while the server shuts down
	// 429 answers, with Retry-After: a token over its request rate, a
	// token over its share of live records, a client address past its
	// budget of failed authentications.
	CodeRateLimited         = "rate_limited"
	CodeQuotaExceeded       = "quota_exceeded"
	CodeTooManyAuthFailures = "too_many_auth_failures"
)

// TryBeginRequest is the body of POST /v1/inbox/try-begin.
type TryBeginRequest struct {
	Key          string `json:"key"`
	Owner        string `json:"owner,omitempty"`
	LeaseSeconds *int64 `json:"leaseSeconds,omitempty"`
	LeaseID      string `json:"leaseId,omitempty"`     // ext.
	PayloadHash  string `json:"payloadHash,omitempty"` // ext.
	AcceptDead   bool   `json:"acceptDead,omitempty"`  // ext. "fail"

	// HasLeaseID is set by DecodeTryBegin when the body names leaseId (an
	// explicit "" is bad input, not "pick one").
	HasLeaseID bool `json:"-"`
}

// TryBeginResponse is the 200 answer of try-begin.
type TryBeginResponse struct {
	Status          string     `json:"status"`
	LeaseID         string     `json:"leaseId,omitempty"`
	ExpiresAt       *time.Time `json:"expiresAt,omitempty"`
	LeaseSeconds    int64      `json:"leaseSeconds,omitempty"`    // ext., granted
	RetryAfterMs    int64      `json:"retryAfterMs,omitempty"`    // ext., with Busy
	Backoff         bool       `json:"backoff,omitempty"`         // ext. "fail", with Busy: a failed attempt's backoff, no live lease
	PayloadMismatch bool       `json:"payloadMismatch,omitempty"` // ext.
	Attempts        int        `json:"attempts"`                  // ext. "fail", always sent by this server
	Reason          string     `json:"reason,omitempty"`          // ext. "fail", with Dead
}

// LeaseRequest is the body of mark-processed, release and extend.
// LeaseSeconds is read by extend only; LeaseID may be absent on
// mark-processed only (the ADR's unleased mark).
type LeaseRequest struct {
	Key          string `json:"key"`
	LeaseID      string `json:"leaseId,omitempty"`
	LeaseSeconds *int64 `json:"leaseSeconds,omitempty"`

	// HasLeaseID is set by DecodeLease when the body names leaseId.
	HasLeaseID bool `json:"-"`
}

// FailRequest is the body of POST /v1/inbox/fail (ext. "fail").
type FailRequest struct {
	Key          string `json:"key"`
	LeaseID      string `json:"leaseId"`
	RetryAfterMs *int64 `json:"retryAfterMs,omitempty"`
	Dead         bool   `json:"dead,omitempty"`
	Reason       string `json:"reason,omitempty"`
}

// KeyRequest is the body of POST /v1/inbox/forget and force-release (ext.
// "admin").
type KeyRequest struct {
	Key string `json:"key"`
}

// ListRequest is the body of POST /v1/inbox/list (ext. "admin").
type ListRequest struct {
	State       string `json:"state,omitempty"`
	Prefix      string `json:"prefix,omitempty"`
	OlderThanMs *int64 `json:"olderThanMs,omitempty"`
	Limit       *int64 `json:"limit,omitempty"`
	Cursor      string `json:"cursor,omitempty"`
}

// ListResponse is the 200 answer of list: the records of a page, each with
// its key and the fields of a GET answer, and the cursor of the next page
// ("" when the listing is done).
type ListResponse struct {
	Items []ListItem `json:"items"`
	Next  string     `json:"next"`
}

// ListItem is one record of a ListResponse.
type ListItem struct {
	Key string `json:"key"`
	RecordResponse
}

// StatusResponse is the 200 answer of mark-processed, release, extend,
// fail, forget and force-release.
type StatusResponse struct {
	Status       string     `json:"status"`
	ExpiresAt    *time.Time `json:"expiresAt,omitempty"`    // extend
	LeaseSeconds int64      `json:"leaseSeconds,omitempty"` // extend, granted (ext.)
}

// RecordResponse is the 200 answer of GET /v1/inbox/{key}.
type RecordResponse struct {
	Status      string     `json:"status"`
	Attempts    int        `json:"attempts"`
	FirstSeen   *time.Time `json:"firstSeen,omitempty"`
	LastSeen    *time.Time `json:"lastSeen,omitempty"`
	LeaseUntil  *time.Time `json:"leaseUntil,omitempty"`
	Owner       string     `json:"owner,omitempty"`
	PayloadHash string     `json:"payloadHash,omitempty"` // ext.
	Reason      string     `json:"reason,omitempty"`      // ext. "fail"
	RetryAt     *time.Time `json:"retryAt,omitempty"`     // ext. "fail"
}

// LeaseRange is the leaseSeconds object of the discovery document.
type LeaseRange struct {
	Min     int64 `json:"min"`
	Max     int64 `json:"max"`
	Default int64 `json:"default"`
}

// DiscoveryResponse is the answer of GET /v1/inbox.
type DiscoveryResponse struct {
	Version      string     `json:"version"`
	Auth         string     `json:"auth"`
	LeaseSeconds LeaseRange `json:"leaseSeconds"`
	LeasePolicy  string     `json:"leasePolicy"`
	Extensions   []string   `json:"extensions"`
	// MaxRetryAfterMs is the longest backoff of a failed attempt the
	// server grants (ext. "fail"); 0 when the server does not say.
	MaxRetryAfterMs int64 `json:"maxRetryAfterMs,omitempty"`
	// RetentionSeconds is the store's retention in whole seconds, when the
	// server knows it (ext.).
	RetentionSeconds int64 `json:"retentionSeconds,omitempty"`
}

// ErrorResponse is the body of 4xx and 5xx answers.
type ErrorResponse struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// DecodeError is a request body the server cannot read. Code is one of the
// Code constants.
type DecodeError struct {
	Code    string
	Message string
}

func (e *DecodeError) Error() string { return e.Code + ": " + e.Message }

// field is one known member of a request object.
type field struct {
	name string
	code string // error code when the value has the wrong type
	dst  any
}

// decodeObject reads body as one JSON object and fills the known fields.
// Member names are matched exactly (encoding/json alone would also accept
// "KEY" for "key"); unknown members are ignored; null means absent. It
// refuses, as invalid_json, a body that is not valid UTF-8 or holds an
// escaped lone surrogate (encoding/json would turn either into U+FFFD, so
// two different keys would name one record), and an object that names a
// member twice (which one counts would be a guess). It reports whether
// leaseId was present.
func decodeObject(body []byte, fields []field) (hasLeaseID bool, err error) {
	if err := checkText(body); err != nil {
		return false, &DecodeError{CodeInvalidJSON, "request body " + err.Error()}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return false, &DecodeError{CodeInvalidJSON, "request body is not a JSON object: " + jsonErr(err)}
	}
	switch tok := tok.(type) {
	case nil:
		return false, &DecodeError{CodeInvalidJSON, "request body is null, want a JSON object"}
	case json.Delim:
		if tok != '{' {
			return false, &DecodeError{CodeInvalidJSON, "request body is not a JSON object: JSON array where an object was expected"}
		}
	default:
		return false, &DecodeError{CodeInvalidJSON, fmt.Sprintf("request body is not a JSON object: JSON %s where an object was expected", scalarKind(tok))}
	}
	obj := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false, &DecodeError{CodeInvalidJSON, "request body is not a JSON object: " + jsonErr(err)}
		}
		name, _ := tok.(string) // the decoder gives a string here or an error
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return false, &DecodeError{CodeInvalidJSON, "request body is not a JSON object: " + jsonErr(err)}
		}
		if _, dup := obj[name]; dup {
			return false, &DecodeError{CodeInvalidJSON, fmt.Sprintf("request body names the member %s twice", quoteName(name))}
		}
		obj[name] = raw
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return false, &DecodeError{CodeInvalidJSON, "request body is not a JSON object: " + jsonErr(err)}
	}
	if _, err := dec.Token(); err != io.EOF {
		return false, &DecodeError{CodeInvalidJSON, "request body holds more than one JSON value"}
	}
	for _, f := range fields {
		raw, ok := obj[f.name]
		if !ok || string(raw) == "null" {
			continue
		}
		if err := json.Unmarshal(raw, f.dst); err != nil {
			return false, &DecodeError{f.code, fmt.Sprintf("field %q: %s", f.name, jsonErr(err))}
		}
		hasLeaseID = hasLeaseID || f.name == "leaseId"
	}
	return hasLeaseID, nil
}

// scalarKind names the JSON type of a scalar token.
func scalarKind(tok json.Token) string {
	switch tok.(type) {
	case string:
		return "string"
	case bool:
		return "boolean"
	}
	return "number"
}

// quoteName quotes a member name for a message, at most 64 bytes of it.
func quoteName(name string) string {
	if len(name) <= 64 {
		return strconv.Quote(name)
	}
	return strconv.Quote(strings.ToValidUTF8(name[:64], "")) + "..."
}

// checkText reports, as a phrase following "request body", where b is not
// valid UTF-8 or holds a \u escape of a lone UTF-16 surrogate in a string.
// Everything else about the JSON is left to the decoder.
func checkText(b []byte) error {
	if !utf8.Valid(b) {
		i := 0
		for i < len(b) {
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			i += n
		}
		return fmt.Errorf("is not valid UTF-8 (byte %d): JSON text must be UTF-8", i)
	}
	inString := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case !inString:
			inString = c == '"'
		case c == '"':
			inString = false
		case c == '\\' && i+1 < len(b) && b[i+1] == 'u':
			r := hex4(b[i+2:])
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return fmt.Errorf("holds a lone low surrogate \\u%04X at byte %d: a string must be valid Unicode", r, i)
			case r >= 0xD800 && r <= 0xDBFF:
				if i+7 >= len(b) || b[i+6] != '\\' || b[i+7] != 'u' {
					return fmt.Errorf("holds a lone high surrogate \\u%04X at byte %d: a string must be valid Unicode", r, i)
				}
				if lo := hex4(b[i+8:]); lo < 0xDC00 || lo > 0xDFFF {
					return fmt.Errorf("holds a lone high surrogate \\u%04X at byte %d: a string must be valid Unicode", r, i)
				}
				i += 11
			default:
				i += 5
			}
		case c == '\\':
			i++ // the escaped byte, which may be '"' or '\\'
		}
	}
	return nil
}

// hex4 is the value of the four hex digits that start b, or -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return -1
		}
	}
	return r
}

// jsonErr shortens encoding/json's messages, which name Go types.
func jsonErr(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("JSON %s where %s was expected", te.Value, wantType(te.Type.String()))
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%s at byte %d", se.Error(), se.Offset)
	}
	return err.Error()
}

func wantType(goType string) string {
	switch goType {
	case "string":
		return "a string"
	case "int64", "int":
		return "an integer"
	case "bool":
		return "a boolean"
	case "map[string]json.RawMessage":
		return "an object"
	}
	return goType
}

// whole decodes leaseSeconds, retryAfterMs, olderThanMs and limit: a JSON
// number (not a string) with an integral value, in any notation ("30",
// "3e1"). Values beyond int64 are saturated, so range checks catch them.
type whole struct {
	v    **int64
	unit string // "seconds", "milliseconds", "" for a count
}

func (s *whole) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] == '"' || b[0] == '{' || b[0] == '[' || b[0] == 't' || b[0] == 'f' {
		return fmt.Errorf("JSON %s where a whole number was expected", kind(b))
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return fmt.Errorf("%s is not a number", b)
	}
	if f != math.Trunc(f) || math.IsNaN(f) {
		if s.unit == "" {
			return fmt.Errorf("%s is not a whole number", b)
		}
		return fmt.Errorf("%s is not a whole number of %s", b, s.unit)
	}
	var n int64
	switch {
	case f >= math.MaxInt64:
		n = math.MaxInt64
	case f <= math.MinInt64:
		n = math.MinInt64
	default:
		n = int64(f)
	}
	*s.v = &n
	return nil
}

func kind(b []byte) string {
	switch b[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	}
	return "boolean"
}

// DecodeTryBegin reads a try-begin body. It checks JSON types only; the
// server validates values.
func DecodeTryBegin(body []byte) (TryBeginRequest, error) {
	var r TryBeginRequest
	var err error
	r.HasLeaseID, err = decodeObject(body, []field{
		{"key", CodeInvalidKey, &r.Key},
		{"owner", CodeInvalidArgument, &r.Owner},
		{"leaseSeconds", CodeInvalidLease, &whole{&r.LeaseSeconds, "seconds"}},
		{"leaseId", CodeInvalidLeaseID, &r.LeaseID},
		{"payloadHash", CodeInvalidArgument, &r.PayloadHash},
		{"acceptDead", CodeInvalidArgument, &r.AcceptDead},
	})
	return r, err
}

// DecodeLease reads a mark-processed, release or extend body.
func DecodeLease(body []byte) (LeaseRequest, error) {
	var r LeaseRequest
	var err error
	r.HasLeaseID, err = decodeObject(body, []field{
		{"key", CodeInvalidKey, &r.Key},
		{"leaseId", CodeInvalidLeaseID, &r.LeaseID},
		{"leaseSeconds", CodeInvalidLease, &whole{&r.LeaseSeconds, "seconds"}},
	})
	return r, err
}

// DecodeFail reads a fail body. HasLeaseID is not kept: fail needs a
// leaseId, and an absent one is as bad as an empty one.
func DecodeFail(body []byte) (FailRequest, error) {
	var r FailRequest
	_, err := decodeObject(body, []field{
		{"key", CodeInvalidKey, &r.Key},
		{"leaseId", CodeInvalidLeaseID, &r.LeaseID},
		{"retryAfterMs", CodeInvalidArgument, &whole{&r.RetryAfterMs, "milliseconds"}},
		{"dead", CodeInvalidArgument, &r.Dead},
		{"reason", CodeInvalidArgument, &r.Reason},
	})
	return r, err
}

// DecodeKey reads a forget or force-release body.
func DecodeKey(body []byte) (KeyRequest, error) {
	var r KeyRequest
	_, err := decodeObject(body, []field{{"key", CodeInvalidKey, &r.Key}})
	return r, err
}

// DecodeList reads a list body.
func DecodeList(body []byte) (ListRequest, error) {
	var r ListRequest
	_, err := decodeObject(body, []field{
		{"state", CodeInvalidArgument, &r.State},
		{"prefix", CodeInvalidArgument, &r.Prefix},
		{"olderThanMs", CodeInvalidArgument, &whole{&r.OlderThanMs, "milliseconds"}},
		{"limit", CodeInvalidArgument, &whole{&r.Limit, ""}},
		{"cursor", CodeInvalidArgument, &r.Cursor},
	})
	return r, err
}

// unreserved are the bytes EscapeKey leaves as they are. Everything else,
// '.', '/', '%' and every non-ASCII byte included, becomes %XX, so that no
// path cleaning, dot-segment removal or decoding step on the way can alter a
// key.
func unreserved(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '~'
}

// EscapeKey returns key as one path segment: bytes outside [A-Za-z0-9_~-]
// as %XX (upper-case hex).
func EscapeKey(key string) string {
	n := 0
	for i := 0; i < len(key); i++ {
		if !unreserved(key[i]) {
			n++
		}
	}
	if n == 0 {
		return key
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(key) + 2*n)
	for i := 0; i < len(key); i++ {
		c := key[i]
		if unreserved(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// KeyFromPath returns the key of an escaped request path
// "/v1/inbox/{escaped key}". ok is false when the path is not under
// KeyPrefix; err is set when the rest is not a valid escape.
func KeyFromPath(escapedPath string) (key string, ok bool, err error) {
	rest, ok := strings.CutPrefix(escapedPath, KeyPrefix)
	if !ok {
		return "", false, nil
	}
	key, err = url.PathUnescape(rest)
	if err != nil {
		return "", true, fmt.Errorf("key path segment is not validly escaped: %v", err)
	}
	return key, true, nil
}

// CeilMillis is d in whole milliseconds, rounded up, for the protocol's
// millisecond fields.
func CeilMillis(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }
