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

// TTLIndexName is the name of the index [Store.EnsureIndexes] creates.
const TTLIndexName = "inbox_expiresAt_ttl"

// Codes of server errors that mean "this server does not do TTL indexes"
// rather than a fault: BadValue, IllegalOperation, CannotCreateIndex,
// InvalidOptions, CommandNotSupported, InvalidIndexSpecificationOption,
// NotImplemented (FerretDB 1.x).
var ttlRefusedCodes = []int{2, 20, 67, 72, 115, 197, 238}

// EnsureIndexes creates, when missing, a TTL index on the expiresAt field
// (expireAfterSeconds 0), so that the server deletes records once their
// retention has passed. It is opt-in: run it once at deployment or startup
// with a user allowed to create indexes. Correctness does not depend on it:
// every query checks expiry itself, so without the index expired records
// only take space.
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
	_, err = b.coll.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys:    bson.D{{Key: "expiresAt", Value: 1}},
		Options: options.Index().SetName(TTLIndexName).SetExpireAfterSeconds(0),
	})
	if err == nil {
		return nil
	}
	if ctx.Err() == nil && ttlRefused(err) {
		b.opts.Logger.Error("mongo store: the server refused the TTL index on expiresAt; "+
			"expired records will not be deleted by the server (reads still ignore them), "+
			"so delete documents whose expiresAt has passed with a job of your own", err,
			watermill.LogFields{"database": b.opts.Database, "collection": b.opts.Collection, "index": TTLIndexName})
		return nil
	}
	return b.fail(ctx, "EnsureIndexes", err)
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
