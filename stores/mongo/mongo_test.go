package mongostore_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
	mongostore "github.com/watermill-inbox/inbox/stores/mongo"
	"github.com/watermill-inbox/inbox/stores/mongo/internal/mongotest"
)

// TestMongod runs the whole suite, concurrency cases included, against the
// mongod named by INBOX_TEST_MONGO_URL; it skips when that is unset. The
// FerretDB run lives in module stores/mongo/ferrettest.
func TestMongod(t *testing.T) {
	uri := testenv.Mongo.URL(t)
	mongotest.Run(t, mongotest.Server{URI: uri, TTL: true})
}

func BenchmarkMongod(b *testing.B) {
	mongotest.Bench(b, testenv.Mongo.URL(b))
}

// deadClient is a client of an address where nothing listens; mongo.Connect
// does no I/O, so it is enough for the checks made before any round trip.
func deadClient(t *testing.T) *mongo.Client {
	t.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	return c
}

func TestNew_invalid_options(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := deadClient(t)
	for name, tc := range map[string]struct {
		client *mongo.Client
		opts   mongostore.Options
		want   error
	}{
		"nil client":         {nil, mongostore.Options{Database: "db"}, inbox.ErrInvalidArgument},
		"no database":        {client, mongostore.Options{}, inbox.ErrInvalidArgument},
		"dotted database":    {client, mongostore.Options{Database: "a.b"}, inbox.ErrInvalidArgument},
		"system collection":  {client, mongostore.Options{Database: "db", Collection: "system.users"}, inbox.ErrInvalidArgument},
		"dollar collection":  {client, mongostore.Options{Database: "db", Collection: "a$b"}, inbox.ErrInvalidArgument},
		"negative retention": {client, mongostore.Options{Database: "db", Retention: -time.Second}, inbox.ErrInvalidArgument},
		"negative lease":     {client, mongostore.Options{Database: "db", Lease: -time.Second}, inbox.ErrInvalidLease},
	} {
		if _, err := mongostore.New(ctx, tc.client, tc.opts); !errors.Is(err, tc.want) {
			t.Errorf("%s: New = %v, want %v", name, err, tc.want)
		}
	}
}

func TestNew_server_down_is_unavailable(t *testing.T) {
	t.Parallel()
	_, err := mongostore.New(context.Background(), deadClient(t), mongostore.Options{Database: "db", Timeout: 300 * time.Millisecond})
	if !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Fatalf("New against a closed port: %v, want ErrStoreUnavailable", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := mongostore.New(ctx, deadClient(t), mongostore.Options{Database: "db"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("New with a canceled context: %v, want context.Canceled", err)
	}
}

func TestOpenURL_rejects_bad_urls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct{ url, mention string }{
		{"mongodb://127.0.0.1:1", "names no database"},
		{"mongodb://127.0.0.1:1/", "names no database"},
		{"mongodb://127.0.0.1:1/a/b", "names no database"},
		{"mongodb://127.0.0.1:1/bad.name", "database name"},
		{"mongodb://127.0.0.1:1/db?colection=x", "colection"},
		{"mongodb://127.0.0.1:1/db?replicaSet=rs0&Bogus=1&zzz=2", "Bogus, zzz"},
		{"mongodb://127.0.0.1:1/db?collection=a&collection=b", "collection"},
		{"mongodb://127.0.0.1:1/db?collection=system.x", "system."},
		{"mongodb://127.0.0.1:1/db?timeout=soon", "timeout"},
		{"mongodb://127.0.0.1:1/db?timeout=-1s", "timeout"},
		{"mongodb://127.0.0.1:1/db?ensure_indexes=maybe", "ensure_indexes"},
		{"mongodb://127.0.0.1:1/db?connectTimeoutMS=soon", "connectTimeoutMS"},
		{"mongodb://127.0.0.1:1/db?retention=forever", "retention"},
		{"mongodb+srv://127.0.0.1:1/db?typo=1", "typo"},
		{"mongodb://127.0.0.1:1/db#frag", "escape '#'"},
		{"mongodb:db", "malformed"},
	} {
		_, err := stores.Open(ctx, tc.url)
		if !errors.Is(err, stores.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, want ErrInvalidURL", tc.url, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("Open(%q) = %q, want it to mention %q", tc.url, err, tc.mention)
		}
	}
}

func TestOpenURL_driver_options_pass_through(t *testing.T) {
	t.Parallel()
	// Known to the driver, so accepted; the server is down, so the open
	// fails as unavailable, not as a bad URL.
	_, err := stores.Open(context.Background(),
		"mongodb://u:s3cretPassw0rd@127.0.0.1:1/db?authSource=admin&appName=x&maxPoolSize=5&directConnection=true&timeout=300ms")
	if !errors.Is(err, inbox.ErrStoreUnavailable) || errors.Is(err, stores.ErrInvalidURL) {
		t.Fatalf("Open with driver options against a closed port: %v, want ErrStoreUnavailable", err)
	}
	if strings.Contains(err.Error(), "s3cretPassw0rd") {
		t.Fatalf("error quotes the password: %v", err)
	}
}

func TestOpenURL_errors_never_quote_secrets(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"mongodb://u:pw-s3cret@127.0.0.1:1/db?bogus=1",
		"mongodb://u:pw-s3cret@127.0.0.1:1/db?tlsCertificateKeyFilePassword=pw-s3cret&connectTimeoutMS=x",
		"mongodb://u:pw-s3cret@127.0.0.1:1/db?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:pw-s3cret&w=bogus&wtimeoutMS=x",
		"mongodb://u:pw-s3cret@127.0.0.1:1/",
	} {
		_, err := stores.Open(context.Background(), raw)
		if err == nil {
			t.Fatalf("Open(%q) succeeded", raw)
		}
		if strings.Contains(err.Error(), "pw-s3cret") {
			t.Errorf("Open error quotes a secret: %v", err)
		}
	}
}

// FuzzOpenURL checks that no query makes an open error quote the password:
// the error of a URL with the password must hold it no more often than the
// error of the same URL with another password.
func FuzzOpenURL(f *testing.F) {
	for _, seed := range [][2]string{
		{"hunterhunter", "collection=x"},
		{"abcdefgh", "bogus=1"},
		{"Secretive", "connectTimeoutMS=Secretive"},
		{"passwordy", "authSource=admin&replicaSet=rs"},
		{"zzzzzzzz", "tls=true&tlsCAFile=/nonexistent"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, pw, query string) {
		if len(pw) < 6 || strings.Trim(pw, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
			t.Skip("passwords of six or more letters only, so they cannot match variable numbers in messages")
		}
		open := func(p string) string {
			// The fixed parameters come first, so a '#' in query cannot hide them.
			// check=true: a query that repeats check fails as a bad URL;
			// check=false would open a store without any error to compare.
			raw := "mongodb://user:" + url.QueryEscape(p) + "@127.0.0.1:1/db?check=true&timeout=1ms&serverSelectionTimeoutMS=1&" + query
			if _, err := stores.Open(context.Background(), raw); err != nil {
				return err.Error()
			}
			t.Fatalf("Open(%q) succeeded with nothing listening", raw)
			return ""
		}
		other := strings.Repeat("Q", len(pw))
		if strings.Contains(query, other) || strings.Contains(pw, "Q") {
			t.Skip()
		}
		with, without := open(pw), open(other)
		if strings.Count(with, pw) > strings.Count(without, pw) {
			t.Fatalf("the error quotes the password %q:\n%s", pw, with)
		}
	})
}
