CREATE TABLE IF NOT EXISTS "inbox" (
	msg_key      TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	state        SMALLINT NOT NULL,
	lease_id     TEXT NOT NULL,
	owner        TEXT NOT NULL,
	lease_until  TIMESTAMPTZ NULL,
	attempts     INTEGER NOT NULL,
	first_seen   TIMESTAMPTZ NOT NULL,
	last_seen    TIMESTAMPTZ NOT NULL,
	processed_at TIMESTAMPTZ NULL,
	payload_hash TEXT NOT NULL,
	expires_at   TIMESTAMPTZ NOT NULL,
	reason       TEXT NOT NULL DEFAULT ''
);

CREATE INDEX IF NOT EXISTS "inbox_expires_at" ON "inbox" (expires_at);

-- A table made by an earlier version of the store, without the column
-- reason, also needs:
-- ALTER TABLE "inbox" ADD COLUMN IF NOT EXISTS reason TEXT NOT NULL DEFAULT '';
