package mongostore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/auth"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
)

// checkKey is the _id the check at Open reads (never writes).
const checkKey = "stores.Open check"

// check is what [stores.Open] runs on a store it made from u, unless the URL
// says check=false, within the store's Timeout: it reads the server's clock
// (the client connects and authenticates), then looks one key up in the
// collection (the user may read it). MongoDB creates a collection at its
// first write, so a missing collection is not an error.
func (b *backend) check(ctx context.Context, u *url.URL) error {
	ctx, cancel, err := b.bound(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	if err := b.clock.sync(ctx, clockSamples); err != nil {
		if errors.Is(err, errServerClock) {
			return fmt.Errorf("%w: mongo store: %v", inbox.ErrNotSupported, err)
		}
		return b.checkError(ctx, u, "reading the server's clock (hello)", err)
	}
	b.logClock()
	err = b.coll.FindOne(ctx, bson.D{{Key: "_id", Value: checkKey}}).Err()
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		return b.checkError(ctx, u, "reading collection "+b.opts.Database+"."+b.opts.Collection, err)
	}
	return nil
}

// Codes of server errors that mean the user or its rights are wrong:
// Unauthorized, AuthenticationFailed.
const (
	codeUnauthorized         = 13
	codeAuthenticationFailed = 18
)

// checkError turns an error of the check into the error of Open: a mistake
// of configuration wraps stores.ErrMisconfigured and
// inbox.ErrStoreUnavailable, anything else inbox.ErrStoreUnavailable only.
// The driver's text is kept, scrubbed of the URL's secrets.
func (b *backend) checkError(ctx context.Context, u *url.URL, step string, err error) error {
	user := ""
	if u.User != nil {
		user = u.User.Username()
	}
	db := b.opts.Database
	authDB := db
	if v := u.Query().Get("authSource"); v != "" {
		authDB = v
	}
	cause := errors.New(scrub(err.Error(), u))
	var se mongo.ServerError
	isServer := errors.As(err, &se)
	switch {
	case errors.As(err, new(*auth.Error)) || (isServer && se.HasErrorCode(codeAuthenticationFailed)):
		return stores.Misconfigured(fmt.Sprintf("mongo store: authentication failed for user %s (authentication database %s) at %s: check the user and password in the URL, and authSource if the user is defined in another database", user, authDB, u.Host), cause)
	case isServer && se.HasErrorCode(codeUnauthorized):
		who := "the URL's user"
		if user != "" {
			who = "user " + user
		}
		if u.User == nil {
			return stores.Misconfigured(fmt.Sprintf("mongo store: the server at %s requires authentication: add user and password to the URL (mongodb://user:password@host/%s)", u.Host, db), cause)
		}
		return stores.Misconfigured(fmt.Sprintf("mongo store: %s may not read collection %s.%s at %s: grant it the readWrite role on database %s", who, db, b.opts.Collection, u.Host, db), cause)
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("mongo store: Open: %s: %w", step, ctx.Err())
	}
	hint := ""
	if strings.Contains(cause.Error(), "replicaSet") || u.Query().Has("replicaSet") {
		hint = " (and the replicaSet name)"
	}
	return fmt.Errorf("mongo store: Open: cannot reach %s (%s): %w: %v; is the server up and the address right%s? check=false in the URL opens without this check",
		u.Host, step, inbox.ErrStoreUnavailable, cause, hint)
}

// logSink routes the driver's log, which MongoDB's MONGODB_LOG_* environment
// variables turn on and which goes to standard error by default, to the
// store's Watermill logger: informational messages at info level, debug
// ones at debug level, errors at error level.
type logSink struct{ l watermill.LoggerAdapter }

var _ options.LogSink = logSink{}

func (k logSink) Info(level int, msg string, kv ...any) {
	f := fields(kv)
	if level <= 0 {
		k.l.Info("mongo driver: "+msg, f)
		return
	}
	k.l.Debug("mongo driver: "+msg, f)
}

func (k logSink) Error(err error, msg string, kv ...any) {
	k.l.Error("mongo driver: "+msg, err, fields(kv))
}

func fields(kv []any) watermill.LogFields {
	f := watermill.LogFields{"source": "mongo-driver"}
	for i := 0; i+1 < len(kv); i += 2 {
		if k, ok := kv[i].(string); ok {
			f[k] = kv[i+1]
		}
	}
	return f
}
