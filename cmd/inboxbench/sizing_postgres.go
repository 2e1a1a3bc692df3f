package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// pgServer is a postgres of the sizing section's own, on a free loopback
// port, for the prefilled PostgreSQL rows, with a max_wal_size sized for
// the trials' rate as docs/stores.md advises. On the shared server, with
// its 1 GB, the trials' WAL forced a checkpoint about every 36 s; after
// each, a claim's first change to a leaf page of the 5-million-key
// primary key is logged as the whole page, which an empty store's few
// pages do not pay, so the prefilled rows measured where checkpoints fell
// (0.87 to 0.95 across runs). Everything else is initdb's default but
// autovacuum, off as on the shared server, so that no vacuum of its own
// choosing runs during a trial.
type pgServer struct {
	*ownServer
	bin string // the directory of initdb and postgres
}

// pgMaxWAL is the max_wal_size of the section's own PostgreSQL server.
const pgMaxWAL = "8GB"

// findPostgres is the default of -sizing-postgres: the directory of the
// newest Debian PostgreSQL, or the one of postgres on PATH; "" when there
// is none.
func findPostgres() string {
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres"); len(m) > 0 {
		return filepath.Dir(m[len(m)-1])
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		return filepath.Dir(p)
	}
	return ""
}

// asServerUser makes cmd run as the postgres user when this process runs
// as root, which postgres refuses to run as.
func asServerUser(cmd *exec.Cmd, owner *user.User) {
	if owner == nil {
		return
	}
	uid, _ := strconv.Atoi(owner.Uid)
	gid, _ := strconv.Atoi(owner.Gid)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
}

func startPostgres(ctx context.Context, bin string) (*pgServer, error) {
	var owner *user.User
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("postgres does not run as root, and there is no postgres user to run it as: %w", err)
		}
		owner = u
	}
	s, err := newOwnServer("postgres")
	if err != nil {
		return nil, err
	}
	ps := &pgServer{ownServer: s, bin: bin}
	if owner != nil {
		uid, _ := strconv.Atoi(owner.Uid)
		gid, _ := strconv.Atoi(owner.Gid)
		if err := os.Chown(s.dir, uid, gid); err != nil {
			ps.close()
			return nil, err
		}
	}
	data := filepath.Join(s.dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	asServerUser(initdb, owner)
	if out, err := initdb.CombinedOutput(); err != nil {
		ps.close()
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	logPath := filepath.Join(s.dir, "server.log")
	log, err := os.Create(logPath)
	if err != nil {
		ps.close()
		return nil, err
	}
	defer log.Close()
	if owner != nil {
		uid, _ := strconv.Atoi(owner.Uid)
		gid, _ := strconv.Atoi(owner.Gid)
		_ = os.Chown(logPath, uid, gid)
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", s.port, "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "max_wal_size="+pgMaxWAL, "-c", "autovacuum=off")
	asServerUser(cmd, owner)
	cmd.Stdout, cmd.Stderr = log, log
	db, err := sql.Open("pgx", ps.url())
	if err != nil {
		ps.close()
		return nil, err
	}
	defer db.Close()
	if err := s.start(ctx, cmd, 60*time.Second, func() error { return db.PingContext(ctx) }); err != nil {
		logText, _ := os.ReadFile(logPath)
		ps.close()
		return nil, fmt.Errorf("%w; its log:\n%s", err, logText)
	}
	return ps, nil
}

func (s *pgServer) url() string {
	return "postgres://postgres@" + s.addr + "/postgres?sslmode=disable"
}

// close stops the server with a fast shutdown (SIGINT), so that its
// backends end with it, and removes its directory.
func (s *pgServer) close() {
	s.stop(syscall.SIGINT, 30*time.Second)
	s.ownServer.close()
}

// errNoPostgres says that -sizing-postgres names no PostgreSQL.
var errNoPostgres = errors.New("no initdb and postgres there")

func checkPostgresBin(bin string) error {
	for _, f := range []string{"initdb", "postgres"} {
		if _, err := os.Stat(filepath.Join(bin, f)); err != nil {
			return fmt.Errorf("-sizing-postgres %s: %w (%v)", bin, errNoPostgres, err)
		}
	}
	return nil
}
