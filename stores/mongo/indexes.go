package mongostore

import (
	"context"
	"errors"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TTLIndexName is the name of the TTL index the store creates ([Store.EnsureIndexes]).
const TTLIndexName = "inbox_expiresAt_ttl"

// Codes of server errors that mean "this server does not do TTL indexes"
// rather than a fault: BadValue, IllegalOperation, CannotCreateIndex,
// InvalidOptions, CommandNotSupported, InvalidIndexSpecificationOption,
// NotImplemented (FerretDB 1.x).
var ttlRefusedCodes = []int{2, 20, 67, 72, 115, 197, 238}

// EnsureIndexes creates, when missing, a TTL index on the expiresAt field
// (expireAfterSeconds 0), so that the server deletes records once their
// retention has passed. [New] and a store opened by URL run it by default,
// creating the index with the collection (Options.NoTTLIndex and
// ensure_indexes=false turn that off); call it yourself when the
// application's user may not create indexes, with one that may.
// Correctness does not depend on it: every query checks expiry itself, so
// without the index expired records only take space.
//
// A server that refuses TTL indexes (FerretDB 1.x answers NotImplemented) is
// not a failure: EnsureIndexes logs the refusal at error level through
// Options.Logger and returns nil; delete documents whose expiresAt has passed
// with a job of your own there. Other faults (network, authorization, an
// existing index of the same name with other options) are returned, wrapping
// inbox.ErrStoreUnavailable.
func (s *Store) EnsureIndexes(ctx context.Context) error {
	b := s.b
	ctx, cancel, err := b.bound(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	return b.ensureTTL(ctx, true)
}

// ensureTTL creates the TTL index. A server that refuses TTL indexes is
// logged; so is, unless explicit (EnsureIndexes), a user that may not create
// indexes (New and Open create the index by default, and a least-privilege
// user must still be able to open the store).
func (b *backend) ensureTTL(ctx context.Context, explicit bool) error {
	_, err := b.coll.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys:    bson.D{{Key: "expiresAt", Value: 1}},
		Options: options.Index().SetName(TTLIndexName).SetExpireAfterSeconds(0),
	})
	if err == nil {
		return nil
	}
	fields := watermill.LogFields{"database": b.opts.Database, "collection": b.opts.Collection, "index": TTLIndexName}
	switch {
	case ctx.Err() != nil:
	case ttlRefused(err):
		b.opts.Logger.Error("mongo store: the server refused the TTL index on expiresAt; "+
			"expired records will not be deleted by the server (reads still ignore them), "+
			"so delete documents whose expiresAt has passed with a job of your own", err, fields)
		return nil
	case !explicit && unauthorized(err):
		b.opts.Logger.Error("mongo store: the user may not create the TTL index on expiresAt; "+
			"expired records will not be deleted by the server (reads still ignore them): "+
			"create the index once with a user that may (Store.EnsureIndexes, ensure_indexes=true), "+
			"or say you do not want it (Options.NoTTLIndex, ensure_indexes=false)", err, fields)
		return nil
	}
	return b.fail(ctx, "creating the TTL index", err)
}

// unauthorized reports a server's Unauthorized error (code 13).
func unauthorized(err error) bool {
	var se mongo.ServerError
	return errors.As(err, &se) && se.HasErrorCode(13)
}

func ttlRefused(err error) bool {
	var se mongo.ServerError
	if !errors.As(err, &se) || mongo.IsNetworkError(err) ||
		se.HasErrorCode(85) || se.HasErrorCode(86) { // IndexOptionsConflict, IndexKeySpecsConflict
		return false
	}
	for _, c := range ttlRefusedCodes {
		if se.HasErrorCode(c) {
			return true
		}
	}
	return strings.Contains(err.Error(), "expireAfterSeconds")
}
