package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
	"github.com/watermill-inbox/inbox/stores/redis/internal/redistest"
)

// The password of the private servers of these tests; no error may quote it
// or the wrong one.
const (
	goodPassword  = "g00d-Pa55word"
	wrongPassword = "wr0ng-Pa55word"
)

// openFails opens raw, which must fail at Open with an error wrapping
// inbox.ErrStoreUnavailable, and stores.ErrMisconfigured when misconfigured
// is set (and not otherwise), that holds every one of want and quotes no
// password. With check=false the same URL must open, and the first call
// fail with inbox.ErrStoreUnavailable, quoting no password either.
func openFails(t *testing.T, raw string, misconfigured bool, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := stores.Open(ctx, raw)
	if err == nil {
		_ = s.Close()
		t.Fatalf("Open(%s) succeeded", raw)
	}
	t.Logf("Open: %v", err)
	if !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Errorf("Open: error does not wrap inbox.ErrStoreUnavailable: %v", err)
	}
	if errors.Is(err, stores.ErrMisconfigured) != misconfigured {
		t.Errorf("Open: errors.Is(err, stores.ErrMisconfigured) = %v, want %v: %v", !misconfigured, misconfigured, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Open: error does not say %q: %v", w, err)
		}
	}
	noSecret(t, err)

	lazy := withQuery(t, raw, "check=false")
	s, err = stores.Open(ctx, lazy)
	if err != nil {
		t.Fatalf("Open with check=false: %v", err)
	}
	defer s.Close()
	_, err = s.TryBegin(ctx, "k", inbox.BeginOptions{})
	if !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Errorf("first call of a store opened with check=false: %v; want inbox.ErrStoreUnavailable", err)
	}
	noSecret(t, err)
}

func noSecret(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	for _, pw := range []string{goodPassword, wrongPassword} {
		if strings.Contains(err.Error(), pw) {
			t.Errorf("error quotes a password: %v", err)
		}
	}
}

// A private server with requirepass: the shared one has no password and
// takes any.
func TestOpenURL_checks_the_password(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{Password: goodPassword})
	t.Run("wrong", func(t *testing.T) {
		t.Parallel()
		openFails(t, "redis://:"+wrongPassword+"@"+srv.Addr()+"/0", true,
			"authentication failed for user default at "+srv.Addr(), "check the user and password in the URL")
	})
	t.Run("unknown user", func(t *testing.T) {
		t.Parallel()
		openFails(t, "redis://nobody:"+goodPassword+"@"+srv.Addr()+"/0", true,
			"authentication failed for user nobody at "+srv.Addr())
	})
	t.Run("missing", func(t *testing.T) {
		t.Parallel()
		openFails(t, "redis://"+srv.Addr()+"/0", true, "authentication failed for user default at "+srv.Addr())
	})
	t.Run("right", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		s, err := stores.Open(ctx, "redis://:"+goodPassword+"@"+srv.Addr()+"/0")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if c, err := s.TryBegin(ctx, "k-right", inbox.BeginOptions{}); err != nil || c.Status != inbox.Acquired {
			t.Fatalf("TryBegin = %+v, %v", c, err)
		}
	})
}

// A user whose ACL keeps it off the store's keys fails at Open, naming what
// it may not do.
func TestOpenURL_checks_the_acl(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	if err := c.Do(context.Background(), "ACL", "SETUSER", "app", "on", ">"+goodPassword, "~other:*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	openFails(t, "redis://app:"+goodPassword+"@"+srv.Addr()+"/0", true, "user app may not run", "ACL")
	ctx := context.Background()
	s, err := stores.Open(ctx, "redis://app:"+goodPassword+"@"+srv.Addr()+"/0?prefix=other:")
	if err != nil {
		t.Fatalf("Open with the prefix the ACL allows: %v", err)
	}
	_ = s.Close()
	// Scripts allowed, but not the fast claim's SET: refused at Open too.
	if err := c.Do(context.Background(), "ACL", "SETUSER", "noset", "on", ">"+goodPassword, "~*", "+@all", "-set").Err(); err != nil {
		t.Fatal(err)
	}
	openFails(t, "redis://noset:"+goodPassword+"@"+srv.Addr()+"/0", true, "user noset may not run SET", "ACL")
}

func TestOpenURL_checks_the_database(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testenv.Redis.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/999"
	openFails(t, u.String(), true, `database in the URL's path "/999" does not exist at `+u.Host)
}

func TestOpenURL_unreachable(t *testing.T) {
	t.Parallel()
	openFails(t, "redis://:"+wrongPassword+"@127.0.0.1:1/0?timeout=2s", false,
		"cannot reach 127.0.0.1:1", "connection refused", "check=false")
}

func TestOpenURL_tls_mistakes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{TLS: true})
	t.Run("untrusted certificate", func(t *testing.T) {
		t.Parallel()
		openFails(t, "rediss://"+srv.Addr()+"/0?timeout=2s", true, "TLS certificate of "+srv.Addr()+" is not trusted", "skip_verify=true")
	})
	t.Run("plain to a TLS port", func(t *testing.T) {
		t.Parallel()
		openFails(t, "redis://"+srv.Addr()+"/0?timeout=1s&max_retries=-1", false, srv.Addr())
	})
}

// captureLog is a watermill.LoggerAdapter that keeps debug lines.
type captureLog struct {
	watermill.NopLogger
	mu    sync.Mutex
	lines []string
}

func (l *captureLog) Debug(msg string, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprint(msg, " ", fields))
}

func (l *captureLog) has(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// go-redis's own lines go to the logger given to SetLogger. Not parallel:
// the logger is the process's.
func TestSetLogger_routes_go_redis_lines(t *testing.T) {
	l := &captureLog{}
	redisstore.SetLogger(l)
	defer redisstore.SetLogger(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if s, err := stores.Open(ctx, "redis://127.0.0.1:1/0?timeout=2s"); err == nil {
		_ = s.Close()
		t.Fatal("Open of a closed port succeeded")
	}
	if !l.has("go-redis: connection pool: failed to dial") || !l.has("source:go-redis") {
		t.Fatalf("the logger got %q; want go-redis's failed dial, with source:go-redis", l.lines)
	}
}

// Without a logger, go-redis prints nothing to standard error: the test
// binary runs itself, dialing a closed port, and its standard error must be
// empty.
func TestSetLogger_nothing_on_stderr_by_default(t *testing.T) {
	t.Parallel()
	if os.Getenv("REDISSTORE_STDERR_CHILD") == "1" {
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSetLogger_stderr_child$", "-test.count=1")
	cmd.Env = append(os.Environ(), "REDISSTORE_STDERR_CHILD=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("child: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "child dialed") {
		t.Fatalf("the child did not run:\n%s", stdout.String())
	}
	if stderr.Len() != 0 {
		t.Fatalf("go-redis wrote to standard error:\n%s", stderr.String())
	}
}

// TestSetLogger_stderr_child is the child of the test above.
func TestSetLogger_stderr_child(t *testing.T) {
	if os.Getenv("REDISSTORE_STDERR_CHILD") != "1" {
		t.Skip("runs as the child of TestSetLogger_nothing_on_stderr_by_default")
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err == nil {
		t.Fatal("PING of a closed port succeeded")
	}
	os.Stdout.WriteString("child dialed\n")
}
