package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"time"
)

// mariaServer is a mariadbd of the sizing section's own, on a free
// loopback port, for the prefilled MariaDB rows: its buffer pool holds the
// prefilled table, as one sized for its data would. The server the tests
// share runs MariaDB's default pool of 128 MB and reads with O_DIRECT, so
// there a table of 5 million keys (some 1.7 GB) is read from the disk at
// nearly every claim: there the store kept 0.71 of its empty throughput,
// and a floor table of two columns, deleted at the write rate, 0.47 to
// 0.67. Its redo log is 1 GB against the default 96 MB, as is usual with a
// large pool (its part in the figures was not measured apart).
type mariaServer struct{ *ownServer }

// mariaRedoLog is the redo log of the section's own MariaDB server.
const mariaRedoLog = "1G"

func startMariaDB(ctx context.Context, bin, pool string) (*mariaServer, error) {
	install, err := exec.LookPath("mariadb-install-db")
	if err != nil {
		return nil, fmt.Errorf("mariadb-install-db, which makes the server's data directory: %w", err)
	}
	u, err := user.Current()
	if err != nil {
		return nil, err
	}
	s, err := newOwnServer("mariadb")
	if err != nil {
		return nil, err
	}
	data := filepath.Join(s.dir, "data")
	if out, err := exec.CommandContext(ctx, install, "--no-defaults", "--datadir="+data, "--user="+u.Username,
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput(); err != nil {
		s.close()
		return nil, fmt.Errorf("mariadb-install-db: %w: %s", err, out)
	}
	log, err := os.Create(filepath.Join(s.dir, "server.log"))
	if err != nil {
		s.close()
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(bin, "--no-defaults", "--datadir="+data, "--user="+u.Username,
		"--port="+s.port, "--bind-address=127.0.0.1", "--socket="+filepath.Join(s.dir, "sock"),
		"--skip-log-bin", "--innodb-buffer-pool-size="+pool, "--innodb-log-file-size="+mariaRedoLog)
	cmd.Stdout, cmd.Stderr = log, log
	db, err := sql.Open("mysql", "root@tcp("+s.addr+")/")
	if err != nil {
		s.close()
		return nil, err
	}
	defer db.Close()
	ready := func() error {
		_, err := db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS inboxbench")
		return err
	}
	if err := s.start(ctx, cmd, 60*time.Second, ready); err != nil {
		logText, _ := os.ReadFile(log.Name())
		s.close()
		return nil, fmt.Errorf("%w; its log:\n%s", err, logText)
	}
	return &mariaServer{s}, nil
}

func (s *mariaServer) url() string { return "mysql://root@" + s.addr + "/inboxbench" }
