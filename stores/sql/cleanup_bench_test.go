package sqlstore_test

import (
	"testing"

	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
)

// BenchmarkCleanup_postgres measures one cleanup batch on PostgreSQL: 1,000
// expired rows deleted from a table that also holds 200,000 retained rows
// with random keys, as an inbox's janitor finds it. The expired rows are
// written with SQL before each batch, outside the timer; Cleanup runs
// until a statement deletes fewer than a batch, so each iteration is that
// batch and one empty statement.
func BenchmarkCleanup_postgres(b *testing.B) {
	be := backends[0]
	db := be.open(b)
	table := newTable(b, db, be.dialect)
	s := newStore(b, be, db, table, sqlstore.Options{})
	ctx := ctxT(b)
	fill := func(n int, expired bool) {
		at := "now() + interval '7 days'"
		if expired {
			at = "now() - interval '1 hour'"
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO `+table+` (expires_at, first_seen, last_seen, attempts, state, msg_key, payload_hash)
SELECT `+at+`, now(), now(), 1, 1, 'rabbit:billing:orders:' || gen_random_uuid(), decode(md5(random()::text), 'hex')
FROM generate_series(1, $1)`, n); err != nil {
			b.Fatal(err)
		}
	}
	fill(200_000, false)
	if _, err := db.ExecContext(ctx, "VACUUM ANALYZE "+table); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		b.StopTimer()
		fill(sqlstore.DefaultCleanupBatch, true)
		b.StartTimer()
		n, err := s.Cleanup(ctx)
		if err != nil || n != sqlstore.DefaultCleanupBatch {
			b.Fatalf("Cleanup = %d, %v; want %d", n, err, sqlstore.DefaultCleanupBatch)
		}
	}
}
