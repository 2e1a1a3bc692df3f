package sqlstore_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
)

func TestCaptureV1(t *testing.T) {
	if os.Getenv("INBOX_CAPTURE") == "" {
		t.Skip()
	}
	for _, b := range []backend{backends[0], backends[1], backends[3]} {
		db := b.open(t)
		table := newTable(t, db, b.dialect)
		s := newStore(t, b, db, table, sqlstore.Options{})
		ctx := ctxT(t)
		sum := sha256.Sum256([]byte("payload"))
		hash := hex.EncodeToString(sum[:])
		begin := func(key, owner, h, lid string) inbox.Claim {
			c, err := s.TryBegin(ctx, key, inbox.BeginOptions{Lease: time.Hour, Owner: owner, PayloadHash: h, LeaseID: lid})
			if err != nil || c.Status != inbox.Acquired {
				t.Fatal(key, c, err)
			}
			return c
		}
		must := func(err error) {
			if err != nil {
				t.Fatal(err)
			}
		}
		begin("k:inflight", "worker-a", hash, "lease-inflight-0123456789abcdef")
		c := begin("k:released", "worker-b", hash, "")
		must(s.Release(ctx, "k:released", c.LeaseID))
		c = begin("k:backoff", "worker-c", hash, "")
		must(s.Fail(ctx, "k:backoff", c.LeaseID, inbox.FailOptions{RetryAfter: time.Hour, Reason: "boom"}))
		c = begin("k:processed", "worker-d", hash, "lease-processed-0123456789abcdef")
		must(s.Complete(ctx, "k:processed", c.LeaseID))
		c = begin("k:processed-opaque", "worker-e", "h1", "lease-opaque")
		must(s.Complete(ctx, "k:processed-opaque", c.LeaseID))
		c = begin("k:processed-16", "worker-e", "abcdefghijklmnop", "")
		must(s.Complete(ctx, "k:processed-16", c.LeaseID))
		c = begin("k:retried", "worker-f", hash, "")
		must(s.Fail(ctx, "k:retried", c.LeaseID, inbox.FailOptions{Reason: "first try"}))
		c = begin("k:retried", "worker-f", hash, "lease-retried")
		must(s.Complete(ctx, "k:retried", c.LeaseID))
		must(s.MarkProcessed(ctx, "k:marked"))
		c = begin("k:dead", "worker-g", hash, "")
		must(s.Fail(ctx, "k:dead", c.LeaseID, inbox.FailOptions{Dead: true, Reason: "poison: bad input"}))
		c = begin("k:nohash", "worker-h", "", "")
		must(s.Complete(ctx, "k:nohash", c.LeaseID))

		var q, now string
		switch b.dialect {
		case sqlstore.Postgres:
			us := func(c string) string { return "(extract(epoch from " + c + ")*1000000)::bigint" }
			now = us("clock_timestamp()")
			q = "SELECT msg_key, state, lease_id, owner, " + us("lease_until") + ", attempts, " + us("first_seen") + ", " + us("last_seen") + ", " + us("processed_at") + ", payload_hash, " + us("expires_at") + ", reason FROM \"" + table + "\" ORDER BY msg_key"
		case sqlstore.MySQL:
			us := func(c string) string { return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " + c + ")" }
			now = us("UTC_TIMESTAMP(6)")
			q = "SELECT msg_key, state, lease_id, owner, " + us("lease_until") + ", attempts, " + us("first_seen") + ", " + us("last_seen") + ", " + us("processed_at") + ", payload_hash, " + us("expires_at") + ", reason FROM `" + table + "` ORDER BY msg_key"
		default:
			now = "(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)"
			q = "SELECT msg_key, state, lease_id, owner, lease_until, attempts, first_seen, last_seen, processed_at, payload_hash, expires_at, reason FROM \"" + table + "\" ORDER BY msg_key"
		}
		var nowUS int64
		must(db.QueryRowContext(ctx, "SELECT "+now).Scan(&nowUS))
		rows, err := db.QueryContext(ctx, q)
		must(err)
		type row struct {
			MsgKey      string `json:"msg_key"`
			State       int    `json:"state"`
			LeaseID     string `json:"lease_id"`
			Owner       string `json:"owner"`
			LeaseUntil  *int64 `json:"lease_until"`
			Attempts    int    `json:"attempts"`
			FirstSeen   int64  `json:"first_seen"`
			LastSeen    int64  `json:"last_seen"`
			ProcessedAt *int64 `json:"processed_at"`
			PayloadHash string `json:"payload_hash"`
			ExpiresAt   int64  `json:"expires_at"`
			Reason      string `json:"reason"`
		}
		var out []row
		for rows.Next() {
			var r row
			must(rows.Scan(&r.MsgKey, &r.State, &r.LeaseID, &r.Owner, &r.LeaseUntil, &r.Attempts, &r.FirstSeen, &r.LastSeen, &r.ProcessedAt, &r.PayloadHash, &r.ExpiresAt, &r.Reason))
			rel := func(p *int64) {
				if p != nil {
					*p -= nowUS
				}
			}
			rel(r.LeaseUntil)
			rel(&r.FirstSeen)
			rel(&r.LastSeen)
			rel(r.ProcessedAt)
			rel(&r.ExpiresAt)
			out = append(out, r)
		}
		must(rows.Err())
		name := "postgres"
		if b.dialect == sqlstore.MySQL {
			name = "mysql"
		} else if b.dialect == sqlstore.SQLite {
			name = "sqlite"
		}
		buf, err := json.MarshalIndent(out, "", "\t")
		must(err)
		must(os.WriteFile(filepath.Join("testdata", "upgrade", name+".rows.json"), append(buf, '\n'), 0o644))
		ddl, err := sqlstore.DDL(b.dialect, "inbox")
		must(err)
		must(os.WriteFile(filepath.Join("testdata", "upgrade", name+".ddl.sql"), []byte(ddl), 0o644))
	}
}
