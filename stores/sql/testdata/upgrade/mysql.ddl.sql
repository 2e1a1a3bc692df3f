CREATE TABLE IF NOT EXISTS `inbox` (
	msg_key      VARBINARY(1024) NOT NULL,
	state        TINYINT NOT NULL,
	lease_id     VARBINARY(128) NOT NULL,
	owner        VARBINARY(255) NOT NULL,
	lease_until  DATETIME(6) NULL,
	attempts     INT NOT NULL,
	first_seen   DATETIME(6) NOT NULL,
	last_seen    DATETIME(6) NOT NULL,
	processed_at DATETIME(6) NULL,
	payload_hash VARBINARY(128) NOT NULL,
	expires_at   DATETIME(6) NOT NULL,
	reason       VARBINARY(1024) NOT NULL DEFAULT '',
	PRIMARY KEY (msg_key),
	INDEX `inbox_expires_at` (expires_at)
) ENGINE=InnoDB;

-- A table made by an earlier version of the store, without the column
-- reason, also needs:
-- ALTER TABLE `inbox` ADD COLUMN reason VARBINARY(1024) NOT NULL DEFAULT '';
