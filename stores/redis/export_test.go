package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// The operations script, for the benchmark that sends the store's
// commands through go-redis directly (the overhead of the store's Go side
// is measured against it).
var OpsScript = opsScript

// FreshRecord is the bytes of the fast claim's record.
func FreshRecord(id, owner, hash string, leaseUS, ttlMS int64) []byte {
	return fresh(id, owner, hash, leaseUS, ttlMS).encode()
}

// The record codec's Go side (record.go), for the tests of the layouts.
type Record = record

const (
	KindFresh     = kindFresh
	KindHeld      = kindHeld
	KindProcessed = kindProcessed
	KindCompleted = kindCompleted
	KindDead      = kindDead
	KindCompact   = kindCompact
	KindMarked    = kindMarked
	KindTomb      = kindTomb
)

// Fingerprint is what a compact processed record keeps of its lease id.
func Fingerprint(leaseID string) string { return fingerprint(leaseID) }

// CompactHash is the form in which the store keeps a payload hash.
func CompactHash(h string) string { return compactHash(h) }

var ErrRecord = errRecord

func EncodeRecord(r Record) []byte          { return r.encode() }
func DecodeRecord(b []byte) (Record, error) { return decode(b) }

// ViewRecord is r as the scripts' load reads it, given the key's
// PEXPIRETIME (ms) and TIME (µs); false when it is not live.
func ViewRecord(r Record, expiryMS, nowUS int64) (Record, bool) { return r.view(expiryMS, nowUS) }

// CodecScript runs the scripts' side of the codec, the prelude clock every
// script of the store starts with, on KEYS[1]:
//
//   - ARGV "read": {decode's values of the key's bytes, load's values,
//     TIME in µs, PEXPIRETIME in ms}; an empty array stands for no value
//     (decode of bytes that are not a record, load of a key without a live
//     record); load's error reply is the script's;
//   - ARGV "save", then kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs, ra:
//     writes them with save, as every script writes a full record; replies
//     1.
var CodecScript = redis.NewScript(clock + `
if ARGV[1] == 'save' then
  local n = {}
  for i = 2, #ARGV do n[i] = tonumber(ARGV[i]) end
  save(n[2], ARGV[3], ARGV[4], ARGV[5], n[6], n[7], n[8], n[9], n[10], n[11], ARGV[12], n[13])
  return 1
end
local v = redis.call('GET', k)
local raw = {}
if v then raw = {decode(v)} end
local view = {load()}
if type(view[1]) == 'table' then return view[1] end
return {raw, view, now, redis.call('PEXPIRETIME', k)}
`)

// Apply runs ops as one batch of s's driver, as the layer would send them
// together, and returns each one's result and error.
func Apply(ctx context.Context, s *Store, ops []driver.Op) ([]inbox.Claim, []error, error) {
	res, errs := make([]inbox.Claim, len(ops)), make([]error, len(ops))
	err := s.d.Apply(ctx, ops, res, errs)
	return res, errs, err
}
