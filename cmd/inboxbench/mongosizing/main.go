// Command mongosizing is the MongoDB row of inboxbench's sizing section: it
// runs FerretDB v1.24 in this process (SQLite handler, state in a temporary
// directory), claims and marks -n keys of the section's shape through
// stores.Open with a payload hash, and prints one line of JSON: the bytes
// per processed key and per key of the floor (documents holding only the
// key as _id and an expiry date, with an index on the expiry), both from
// collStats' totalSize (on FerretDB over SQLite: the pages of the
// collection's table and indexes, from SQLite's dbstat).
//
// It is a module of its own for the reason stores/mongo/ferrettest is:
// FerretDB builds only with the modernc.org versions it was released with,
// which the library's SQL store, linked by inboxbench, does not build with.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
	_ "github.com/watermill-inbox/inbox/stores/mongo" // mongodb://
)

const database = "inboxbench"

type result struct {
	N       int     `json:"n"`
	Bytes   float64 `json:"bytes"`
	Floor   float64 `json:"floor"`
	Version string  `json:"version"`
}

func main() {
	n := flag.Int("n", 300, "keys")
	workers := flag.Int("workers", 4, "concurrent claims")
	owner := flag.String("owner", "billing-7d9f8c6b5-x2k4q/1", "owner of the claims")
	prefix := flag.String("key-prefix", "rabbit:billing:orders:", "keys are this and a UUID")
	flag.Parse()
	if err := run(*n, *workers, *owner, *prefix); err != nil {
		fmt.Fprintln(os.Stderr, "mongosizing:", err)
		os.Exit(1)
	}
}

func run(n, workers int, owner, prefix string) error {
	dir, err := os.MkdirTemp("", "inboxbench-ferretdb-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	f, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: "127.0.0.1:0"},
		Handler:   "sqlite",
		SQLiteURL: "file:" + dir + "/?_txlock=immediate",
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return fmt.Errorf("starting FerretDB: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	uri := f.MongoDBURI()
	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		return err
	}
	defer func() { _ = client.Disconnect(context.Background()) }()

	u, err := url.Parse(uri)
	if err != nil {
		return err
	}
	u.Path = "/" + database
	q := u.Query()
	q.Set("collection", "inbox")
	q.Set("retention", inbox.DefaultRetention.String())
	q.Set("timeout", "1m")
	u.RawQuery = q.Encode()
	s, err := stores.Open(ctx, u.String())
	if err != nil {
		return err
	}
	defer s.Close()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + uuid.NewString()
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(keys) {
					return
				}
				h := sha256.Sum256([]byte("payload of " + keys[i]))
				c, err := s.TryBegin(ctx, keys[i], inbox.BeginOptions{Owner: owner, Lease: inbox.DefaultLease, LeaseID: inbox.NewLeaseID(), PayloadHash: hex.EncodeToString(h[:])})
				if err == nil && c.Status != inbox.Acquired {
					err = fmt.Errorf("claim of the new key %s: %s", keys[i], c.Status)
				}
				if err == nil {
					err = s.Complete(ctx, keys[i], c.LeaseID)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	size, err := totalSize(ctx, client, "inbox")
	if err != nil {
		return err
	}
	floor := client.Database(database).Collection("floor")
	if _, err := floor.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "expiresAt", Value: 1}}}); err != nil {
		return err
	}
	for i := 0; i < len(keys); i += 500 {
		var docs []any
		for _, k := range keys[i:min(i+500, len(keys))] {
			docs = append(docs, bson.D{{Key: "_id", Value: k}, {Key: "expiresAt", Value: time.Now().Add(inbox.DefaultRetention)}})
		}
		if _, err := floor.InsertMany(ctx, docs); err != nil {
			return err
		}
	}
	fsize, err := totalSize(ctx, client, "floor")
	if err != nil {
		return err
	}
	version := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/FerretDB/FerretDB" {
				version = d.Version
			}
		}
	}
	return json.NewEncoder(os.Stdout).Encode(result{N: n, Bytes: float64(size) / float64(n), Floor: float64(fsize) / float64(n), Version: version})
}

// totalSize is collStats' totalSize of the collection.
func totalSize(ctx context.Context, client *mongo.Client, coll string) (int64, error) {
	var st bson.M
	if err := client.Database(database).RunCommand(ctx, bson.D{{Key: "collStats", Value: coll}}).Decode(&st); err != nil {
		return 0, fmt.Errorf("collStats %s: %w", coll, err)
	}
	switch v := st["totalSize"].(type) {
	case int32:
		return int64(v), nil
	case int64:
		return v, nil
	case float64:
		return int64(v), nil
	}
	return 0, fmt.Errorf("collStats %s: totalSize %v (%T)", coll, st["totalSize"], st["totalSize"])
}
