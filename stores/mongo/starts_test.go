package mongostore_test

import (
	"context"
	"net/url"
	"strconv"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/watermill-inbox/inbox/internal/startstest"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
)

// The inbox middleware over MongoDB starts no goroutine per message: over
// 10,000 messages, one after the other, the claims in the message's
// goroutine and the marks on the store's workers, the count stays under a
// constant. It runs against the mongod of INBOX_TEST_MONGO_URL and skips
// without one: FerretDB in-process (module stores/mongo/ferrettest) counts
// its own goroutines, one or more a query, with the client's, and serves a
// few messages a second.
func TestMiddleware_success_path_starts_no_goroutine_per_message(t *testing.T) {
	// Not parallel: the counts are the whole process's.
	u, err := url.Parse(testenv.Mongo.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	db := "inbox_starts_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Cleanup(func() { dropDatabase(t, u.String(), db) })
	u.Path = "/" + db
	s, err := stores.Open(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	g := startstest.Goroutines(t, s, "starts", nil, startstest.Messages)
	t.Logf("%d messages started %d goroutines", startstest.Messages, g)
	if g > startstest.Bound {
		t.Fatalf("%d messages started %d goroutines, want at most %d", startstest.Messages, g, startstest.Bound)
	}
}

func dropDatabase(t *testing.T, uri, db string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		t.Error(err)
		return
	}
	defer func() { _ = c.Disconnect(ctx) }()
	if err := c.Database(db).Drop(ctx); err != nil {
		t.Error(err)
	}
}
