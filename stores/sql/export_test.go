package sqlstore

import "net/url"

// UseMySQL8Path makes a store on MariaDB run the statements it runs on MySQL
// 8, which has no RETURNING (TryBegin as a short transaction), so the MySQL 8
// path is tested against the MariaDB server this project's CI has.
func UseMySQL8Path(s *Store) {
	s.returning = false
	s.q = buildQueries(s.opts.Dialect, s.opts.Table)
}

// UsesReturning reports whether TryBegin is one statement.
func UsesReturning(s *Store) bool { return s.returning }

// MySQLDSN turns a mysql:// URL into the go-sql-driver DSN the opener uses.
func MySQLDSN(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	cfg, err := mysqlConfig(u)
	if err != nil {
		return "", err
	}
	return cfg.FormatDSN(), nil
}

// OnCleanupBatch makes s call f with the rows each cleanup statement
// deleted.
func OnCleanupBatch(s *Store, f func(n int64)) { s.onBatch = f }

// SQLitePath returns the database path a sqlite:// URL names.
func SQLitePath(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	return sqlitePath(u)
}

// Statements returns the TryBegin and Complete statements of s, for the
// benchmark that runs them without the store around them.
func Statements(s *Store) (tryBegin, complete string) { return s.q.tryBegin, s.q.complete }
