package mongo_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/watermill-inbox/inbox/e2e/internal/harness"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
	_ "github.com/watermill-inbox/inbox/stores/mongo"
)

func TestMain(m *testing.M) {
	code := harness.Main(m)
	ferret.stop()
	os.Exit(code)
}

// notAtomic is why the competing-consumers case skips on FerretDB.
const notAtomic = "FerretDB 1.x reads then writes without a lock, so two consumers could both claim a key " +
	"(a mongod at INBOX_TEST_MONGO_URL runs this case)"

// database holds the suite's collections, one per case.
const database = "inbox_e2e"

func storeKinds() []harness.StoreKind {
	return []harness.StoreKind{
		{Name: "mongodb-ferretdb", New: mongoKind(startFerretDB), NoConcurrency: notAtomic},
		{Name: "mongodb", New: mongoKind(func(t *testing.T) string { return testenv.Mongo.URL(t) })},
	}
}

func TestDuplicates_each_effect_once(t *testing.T) {
	harness.Run(t, storeKinds(), harness.Duplicates)
}

func TestCompetingConsumers_with_failures_exactly_once(t *testing.T) {
	harness.Run(t, storeKinds(), harness.Competing)
}

func TestCrash_before_effect_applied_once_after_lease(t *testing.T) {
	harness.Run(t, storeKinds(), harness.Crash(harness.CrashBeforeEffect))
}

func TestCrash_after_effect_before_mark(t *testing.T) {
	harness.Run(t, storeKinds(), harness.Crash(harness.CrashAfterEffect))
}

func TestStoreOutage_nacked_then_processed_once(t *testing.T) {
	harness.Run(t, storeKinds(), harness.Outage)
}

func TestBadInput_handled_per_policy(t *testing.T) {
	harness.Run(t, storeKinds(), harness.BadInput)
}

// TestPoison_dead_after_max_attempts_then_replayed fails until the
// middleware stops handing a failed attempt before the last one to a poison
// queue filtered with !inboxmw.IsTransient (see module e2e's).
func TestPoison_dead_after_max_attempts_then_replayed(t *testing.T) {
	harness.Run(t, storeKinds(), harness.Poison)
}

// ferret is the FerretDB of this test process, started by the first case
// that needs it (FerretDB's constructor writes a global: one instance per
// process) and stopped by TestMain; each case has its own collection.
var ferret ferretServer

type ferretServer struct {
	once   sync.Once
	uri    string
	err    error
	dir    string
	cancel context.CancelFunc
	done   chan struct{}
}

// startFerretDB returns the connection string of the process's FerretDB
// (SQLite handler, state in a temporary directory).
func startFerretDB(t *testing.T) string {
	t.Helper()
	ferret.once.Do(func() {
		ferret.dir, ferret.err = os.MkdirTemp("", "inbox-e2e-ferretdb-")
		if ferret.err != nil {
			return
		}
		var f *ferretdb.FerretDB
		f, ferret.err = ferretdb.New(&ferretdb.Config{
			Listener:  ferretdb.ListenerConfig{TCP: "127.0.0.1:0"},
			Handler:   "sqlite",
			SQLiteURL: "file:" + ferret.dir + "/",
			Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if ferret.err != nil {
			return
		}
		var ctx context.Context
		ctx, ferret.cancel = context.WithCancel(context.Background())
		ferret.done = make(chan struct{})
		go func() {
			defer close(ferret.done)
			_ = f.Run(ctx)
		}()
		ferret.uri = f.MongoDBURI()
	})
	if ferret.err != nil {
		t.Fatalf("starting FerretDB: %v", ferret.err)
	}
	return ferret.uri
}

func (s *ferretServer) stop() {
	if s.cancel != nil {
		s.cancel()
		<-s.done
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

// mongoKind gives each case a new collection on the server that server
// returns (a connection string without database), dropped when it ends.
func mongoKind(server func(t *testing.T) string) func(t *testing.T) harness.StoreCase {
	return func(t *testing.T) harness.StoreCase {
		uri := server(t)
		var b [6]byte
		_, _ = rand.Read(b[:])
		collection := "e2e_" + hex.EncodeToString(b[:])

		client, err := mongo.Connect(options.Client().ApplyURI(uri))
		if err != nil {
			t.Fatalf("connecting to %s: %v", uri, err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := client.Database(database).Collection(collection).Drop(ctx); err != nil {
				t.Errorf("dropping collection %s: %v", collection, err)
			}
			_ = client.Disconnect(ctx)
		})

		u, err := url.Parse(uri)
		if err != nil {
			t.Fatal(err)
		}
		u.Path = "/" + database
		q := u.Query()
		q.Set("collection", collection)
		q.Set("retention", "1h")
		u.RawQuery = q.Encode()
		direct := u.String()

		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		inspect, err := stores.Open(ctx, direct)
		if err != nil {
			t.Fatalf("opening %s: %v", direct, err)
		}
		t.Cleanup(func() { _ = inspect.Close() })

		sc := harness.StoreCase{Spec: harness.StoreSpec{URL: direct}, Inspect: inspect}
		return sc
	}
}
