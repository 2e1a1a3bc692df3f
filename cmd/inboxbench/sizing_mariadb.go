package main

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"time"
)

// mariaServer is a mariadbd of the sizing section's own, on a free
// loopback port, for the prefilled MariaDB rows: its buffer pool holds the
// prefilled table, as one sized for its data would. The server the tests
// share runs MariaDB's default pool of 128 MB and reads with O_DIRECT, so
// there a table of 5 million keys (some 1.7 GB) is read from the disk at
// nearly every claim: there the store kept 0.71 of its empty throughput,
// and a floor table of two columns, deleted at the write rate, 0.47 to
// 0.67. Its redo log is 1 GB (the default, 96 MB, makes the page cleaner
// flush in bursts once the pool is large).
type mariaServer struct {
	cmd  *exec.Cmd
	dir  string
	addr string
}

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
	port, dir, err := serverPlace("mariadb")
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if out, err := exec.CommandContext(ctx, install, "--no-defaults", "--datadir="+data, "--user="+u.Username,
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("mariadb-install-db: %w: %s", err, out)
	}
	log, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	defer log.Close()
	s := &mariaServer{dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	s.cmd = exec.Command(bin, "--no-defaults", "--datadir="+data, "--user="+u.Username,
		"--port="+strconv.Itoa(port), "--bind-address=127.0.0.1", "--socket="+filepath.Join(dir, "sock"),
		"--skip-log-bin", "--innodb-buffer-pool-size="+pool, "--innodb-log-file-size="+mariaRedoLog)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	db, err := sql.Open("mysql", "root@tcp("+s.addr+")/")
	if err != nil {
		s.close()
		return nil, err
	}
	defer db.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS inboxbench")
		if err == nil {
			return s, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			logText, _ := os.ReadFile(log.Name())
			s.close()
			return nil, fmt.Errorf("mariadbd on %s did not answer: %w; its log:\n%s", s.addr, err, logText)
		}
		time.Sleep(100 * time.Millisecond) // polling for the server's start
	}
}

func (s *mariaServer) close() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	_ = os.RemoveAll(s.dir)
}

func (s *mariaServer) url() string { return "mysql://root@" + s.addr + "/inboxbench" }
