CREATE TABLE IF NOT EXISTS "inbox" (
	msg_key      TEXT NOT NULL PRIMARY KEY,
	state        INTEGER NOT NULL,
	lease_id     TEXT NOT NULL,
	owner        TEXT NOT NULL,
	lease_until  INTEGER NULL,
	attempts     INTEGER NOT NULL,
	first_seen   INTEGER NOT NULL,
	last_seen    INTEGER NOT NULL,
	processed_at INTEGER NULL,
	payload_hash TEXT NOT NULL,
	expires_at   INTEGER NOT NULL,
	reason       TEXT NOT NULL DEFAULT ''
);

CREATE INDEX IF NOT EXISTS "inbox_expires_at" ON "inbox" (expires_at);

-- A table made by an earlier version of the store, without the column
-- reason, also needs:
-- ALTER TABLE "inbox" ADD COLUMN reason TEXT NOT NULL DEFAULT '';
