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
)

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
)

// Extensions is what this project's server lists, in this order.
var Extensions = []string{ExtExtend, ExtLeaseID, ExtPayloadHash, ExtPayloadMismatch}

// Error codes of 4xx and 5xx answers.
const (
	CodeInvalidJSON      = "invalid_json"
	CodeInvalidKey       = "invalid_key"
	CodeInvalidLease     = "invalid_lease"
	CodeInvalidLeaseID   = "invalid_lease_id"
	CodeInvalidArgument  = "invalid_argument"
	CodeBodyTooLarge     = "body_too_large"
	CodeUnauthorized     = "unauthorized"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeNotSupported     = "not_supported"
	CodeStoreUnavailable = "store_unavailable"
	CodeInternal         = "internal_error"
	CodeDraining         = "draining" // /readyz while the server shuts down
)

// TryBeginRequest is the body of POST /v1/inbox/try-begin.
type TryBeginRequest struct {
	Key          string `json:"key"`
	Owner        string `json:"owner,omitempty"`
	LeaseSeconds *int64 `json:"leaseSeconds,omitempty"`
	LeaseID      string `json:"leaseId,omitempty"`     // ext.
	PayloadHash  string `json:"payloadHash,omitempty"` // ext.

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
	PayloadMismatch bool       `json:"payloadMismatch,omitempty"` // ext.
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

// StatusResponse is the 200 answer of mark-processed, release and extend.
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
// reports whether leaseId was present.
func decodeObject(body []byte, fields []field) (hasLeaseID bool, err error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	var obj map[string]json.RawMessage
	if err := dec.Decode(&obj); err != nil {
		return false, &DecodeError{CodeInvalidJSON, "request body is not a JSON object: " + jsonErr(err)}
	}
	if obj == nil {
		return false, &DecodeError{CodeInvalidJSON, "request body is null, want a JSON object"}
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

// seconds decodes leaseSeconds: a JSON number (not a string) with an
// integral value, in any notation ("30", "3e1"). Values beyond int64 are
// saturated, so the lease range check catches them.
type seconds struct{ v **int64 }

func (s *seconds) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] == '"' || b[0] == '{' || b[0] == '[' || b[0] == 't' || b[0] == 'f' {
		return fmt.Errorf("JSON %s where a whole number was expected", kind(b))
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return fmt.Errorf("%s is not a number", b)
	}
	if f != math.Trunc(f) || math.IsNaN(f) {
		return fmt.Errorf("%s is not a whole number of seconds", b)
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
		{"leaseSeconds", CodeInvalidLease, &seconds{&r.LeaseSeconds}},
		{"leaseId", CodeInvalidLeaseID, &r.LeaseID},
		{"payloadHash", CodeInvalidArgument, &r.PayloadHash},
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
		{"leaseSeconds", CodeInvalidLease, &seconds{&r.LeaseSeconds}},
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
