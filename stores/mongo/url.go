package mongostore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
)

// The URL schemes this package registers with
// [github.com/watermill-inbox/inbox/stores]: MongoDB's own connection string
// schemes.
const (
	Scheme    = "mongodb"
	SchemeSRV = "mongodb+srv"
)

// The parameters of a store URL that the store reads; every other parameter
// must be a MongoDB connection string option.
var urlParams = []string{"collection", "timeout", "ensure_indexes"}

// secretParams are the connection string options that carry secrets:
// authMechanismProperties holds AWS_SESSION_TOKEN:<token> with
// authMechanism=MONGODB-AWS, the others the password of the client's TLS
// key. They are registered with [stores.RegisterSecretParams], so that
// [stores.Redact] masks them in logs and errors.
var secretParams = []string{"authMechanismProperties", "tlsCertificateKeyFilePassword", "sslClientCertificateKeyPassword"}

func init() {
	stores.RegisterSecretParams(secretParams...)
	stores.Register(Scheme, stores.OpenerFunc(openURL))
	stores.Register(SchemeSRV, stores.OpenerFunc(openURL))
}

// openURL makes a store that owns its client from a MongoDB connection
// string with the store's parameters. Unless p.Lazy (check=false), it checks
// the store works before returning it (backend.check).
func openURL(ctx context.Context, u *url.URL, p stores.Params) (stores.Store, error) {
	scheme := strings.ToLower(u.Scheme)
	if u.Fragment != "" || u.Opaque != "" {
		// Not quoted: a fragment is most often the tail of a password holding
		// an unescaped '#'.
		return nil, fmt.Errorf("%w: %s:// URL is malformed (a '#' or a missing '//'); escape '#' in passwords as %%23", stores.ErrInvalidURL, scheme)
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, fmt.Errorf("%w: %s://%s%s names no database: write %s://host/DATABASE",
			stores.ErrInvalidURL, scheme, u.Host, u.Path, scheme)
	}
	q := u.Query()
	opts := Options{Database: db, Retention: p.Retention, Lease: p.Lease}
	var err error
	if opts.Collection, _, err = stores.PopString(q, "collection"); err != nil {
		return nil, err
	}
	if opts.Timeout, err = stores.PopDuration(q, "timeout"); err != nil {
		return nil, err
	}
	ensure, explicit := true, false
	if v, ok, err := stores.PopString(q, "ensure_indexes"); err != nil {
		return nil, err
	} else if ok {
		if ensure, err = strconv.ParseBool(v); err != nil {
			return nil, fmt.Errorf("%w: parameter ensure_indexes=%q is not true or false", stores.ErrInvalidURL, v)
		}
		explicit = true
	}
	opts.NoTTLIndex = !ensure
	if err := checkDriverOptions(scheme, q); err != nil {
		return nil, err
	}
	if err := opts.Validate(); err != nil { // before connecting: no client to clean up
		return nil, fmt.Errorf("%w: %w", stores.ErrInvalidURL, err)
	}

	du := *u
	du.RawQuery = q.Encode()
	if opts.Logger == nil {
		opts.Logger = watermill.NewSlogLogger(nil)
	}
	co := options.Client().ApplyURI(du.String()).
		SetLoggerOptions(options.Logger().SetSink(logSink{opts.Logger}))
	client, err := mongo.Connect(co)
	if err != nil {
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) {
			return nil, fmt.Errorf("mongo store: %w: resolving %s: %s", inbox.ErrStoreUnavailable, u.Host, scrub(err.Error(), u))
		}
		return nil, fmt.Errorf("%w: %s", stores.ErrInvalidURL, scrub(err.Error(), u))
	}
	// mongo.Connect sends nothing: the client connects at its first
	// operation, the check's or, with check=false, the first call's.
	s, err := newStore(client, opts)
	if err != nil {
		_ = client.Disconnect(context.WithoutCancel(ctx))
		return nil, err
	}
	s.b.owned = true
	if p.Lazy {
		// The TTL index is created at the first call, with the clock.
		s.b.lazyTTL = ensure
		s.b.ttlPending.Store(ensure)
		return s, nil
	}
	if err := s.b.check(ctx, u); err != nil {
		_ = s.Close()
		return nil, err
	}
	if ensure {
		bctx, cancel, err := s.b.bound(ctx)
		if err == nil {
			err = s.b.ensureTTL(bctx, explicit)
			cancel()
		}
		if err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	return s, nil
}

// checkDriverOptions rejects, by name, the parameters left in q that the
// MongoDB driver does not know either. The driver parses option values
// itself later; parsing them here against a placeholder host only finds the
// names it does not know, without any DNS lookup.
func checkDriverOptions(scheme string, q url.Values) error {
	if len(q) == 0 {
		return nil
	}
	cs, err := connstring.Parse("mongodb://localhost/?" + q.Encode())
	if err != nil {
		return fmt.Errorf("%w: %s", stores.ErrInvalidURL, scrubValues(err.Error(), q))
	}
	var unknown []string
	for name := range q {
		if _, bad := cs.UnknownOptions[strings.ToLower(name)]; bad {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	return fmt.Errorf("%w: unknown parameter(s) %s for %s:// (known: retention, lease, %s, and MongoDB's connection string options such as authSource, replicaSet, tls)",
		stores.ErrInvalidURL, strings.Join(unknown, ", "), scheme, strings.Join(urlParams, ", "))
}

// scrub removes the URL's password and secret parameter values from a
// message that may quote them (a driver error), with the one list of
// secret-bearing parameters of package stores.
func scrub(msg string, u *url.URL) string { return stores.Scrub(msg, u) }

// scrubValues masks the values of q's parameters that carry secrets.
func scrubValues(msg string, q url.Values) string {
	return stores.Scrub(msg, &url.URL{RawQuery: q.Encode()})
}
