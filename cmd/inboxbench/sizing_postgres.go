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
// port, for the prefilled PostgreSQL rows, with a max_wal_size that holds
// the trials' WAL, as docs/stores.md advises. On the shared server, with
// its 1 GB, the trials forced a checkpoint about every 36 s, and the
// figures depended on that server's settings; here the section's report
// counts none. (That was not what held the prefilled row below 0.9: it
// measured 0.87 here too.) Everything else is initdb's default but
// autovacuum, off as on the shared server, so that no vacuum of its own
// choosing runs during a trial.
type pgServer struct{ *ownServer }

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

// serverUser is the credential to run postgres with: the postgres user's
// when this process runs as root, which postgres refuses to run as; nil
// (this process's) otherwise.
func serverUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("postgres does not run as root, and there is no postgres user to run it as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func startPostgres(ctx context.Context, bin string) (*pgServer, error) {
	cred, err := serverUser()
	if err != nil {
		return nil, err
	}
	// as runs cmd as cred; chown gives it path.
	as := func(cmd *exec.Cmd) *exec.Cmd {
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		return cmd
	}
	chown := func(path string) error {
		if cred == nil {
			return nil
		}
		return os.Chown(path, int(cred.Uid), int(cred.Gid))
	}
	s, err := newOwnServer("postgres")
	if err != nil {
		return nil, err
	}
	ps := &pgServer{s}
	if err := chown(s.dir); err != nil {
		ps.close()
		return nil, err
	}
	data := filepath.Join(s.dir, "data")
	initdb := as(exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"))
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
	_ = chown(logPath)
	cmd := as(exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", s.port, "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "max_wal_size="+pgMaxWAL, "-c", "autovacuum=off"))
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
