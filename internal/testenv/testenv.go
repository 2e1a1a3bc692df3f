// Package testenv finds the services that tests need and decides what to do
// when one is missing.
//
// On a developer's bare machine a test whose service is down skips, and the
// skip is appended to the file named by INBOX_SKIP_FILE (set by `make test`),
// which prints one summary line naming what was skipped and how to provide
// it. With INBOX_REQUIRE_SERVICES=1 (set by .ci/run) a missing service fails
// the test instead, unless the service is optional (a real mongod or Kafka,
// which this project's CI machine does not have; their tests fall back to
// in-process servers).
package testenv

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Service is a server some tests need.
type Service struct {
	// Name is short and lower case ("redis").
	Name string
	// Env names the variable that overrides the address.
	Env string
	// Default is the URL used when Env is unset; empty when the service has
	// no default (optional services).
	Default string
	// HowTo tells a developer how to provide the service.
	HowTo string
	// Optional services never fail a test when missing, even with
	// INBOX_REQUIRE_SERVICES=1.
	Optional bool
}

// The services of this project's tests.
var (
	Redis = Service{
		Name: "redis", Env: "INBOX_TEST_REDIS_URL", Default: "redis://127.0.0.1:6379/15",
		HowTo: "start redis-server on 127.0.0.1:6379 or set INBOX_TEST_REDIS_URL",
	}
	Postgres = Service{
		Name: "postgres", Env: "INBOX_TEST_POSTGRES_URL", Default: "postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
		HowTo: "start PostgreSQL on 127.0.0.1:5432 (user postgres, database test) or set INBOX_TEST_POSTGRES_URL",
	}
	MySQL = Service{
		Name: "mysql", Env: "INBOX_TEST_MYSQL_URL", Default: "mysql://root@127.0.0.1:3306/test",
		HowTo: "start MariaDB or MySQL on 127.0.0.1:3306 (user root, database test) or set INBOX_TEST_MYSQL_URL",
	}
	RabbitMQ = Service{
		Name: "rabbitmq", Env: "INBOX_TEST_AMQP_URL", Default: "amqp://guest:guest@127.0.0.1:5672/",
		HowTo: "start RabbitMQ on 127.0.0.1:5672 (guest/guest) or set INBOX_TEST_AMQP_URL",
	}
	Mongo = Service{
		Name: "mongodb", Env: "INBOX_TEST_MONGO_URL",
		HowTo: "set INBOX_TEST_MONGO_URL to a mongod 4.2+ (mongodb://host:27017)", Optional: true,
	}
	Kafka = Service{
		Name: "kafka", Env: "KAFKA_BROKERS",
		HowTo: "set KAFKA_BROKERS to a real broker list (host:9092,...)", Optional: true,
	}
)

// RequireServices reports whether INBOX_REQUIRE_SERVICES asks missing
// services to fail tests.
func RequireServices() bool {
	v := os.Getenv("INBOX_REQUIRE_SERVICES")
	return v != "" && v != "0" && !strings.EqualFold(v, "false")
}

// URL returns the service's URL when it answers on TCP. Otherwise the test
// skips (recording the skip for the summary) or, when services are required
// and s is not optional, fails.
func (s Service) URL(t testing.TB) string {
	t.Helper()
	raw, why := s.lookup()
	if why == "" {
		return raw
	}
	s.missing(t, why)
	return ""
}

// Available reports whether the service answers, without skipping.
func (s Service) Available() (string, bool) {
	raw, why := s.lookup()
	return raw, why == ""
}

var probes sync.Map // URL -> error string ("" when reachable)

func (s Service) lookup() (raw, why string) {
	raw = os.Getenv(s.Env)
	if raw == "" {
		raw = s.Default
	}
	if raw == "" {
		return "", s.Env + " is not set"
	}
	if v, ok := probes.Load(raw); ok {
		return raw, v.(string)
	}
	why = probe(raw)
	probes.Store(raw, why)
	return raw, why
}

// probe dials every host:port the URL names (comma-separated lists, as in
// KAFKA_BROKERS or a Redis cluster, included).
func probe(raw string) string {
	var hosts []string
	if u, err := url.Parse(raw); err == nil && u.Host != "" {
		hosts = strings.Split(u.Host, ",")
	} else {
		hosts = strings.Split(raw, ",")
	}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if _, _, err := net.SplitHostPort(h); err != nil {
			return fmt.Sprintf("cannot tell host:port from %q", redact(raw))
		}
		c, err := net.DialTimeout("tcp", h, 2*time.Second)
		if err != nil {
			return fmt.Sprintf("%s does not answer: %v", h, err)
		}
		_ = c.Close()
	}
	return ""
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

func (s Service) missing(t testing.TB, why string) {
	t.Helper()
	msg := fmt.Sprintf("%s not available (%s): %s", s.Name, why, s.HowTo)
	if RequireServices() && !s.Optional {
		t.Fatalf("%s; INBOX_REQUIRE_SERVICES is set, so this is a failure", msg)
	}
	RecordSkip(s.Name, s.HowTo)
	t.Skip(msg)
}

// Program returns the path of the program name (found in PATH), which the
// test runs. When it is missing, the test skips, recording the skip with
// how, which tells a developer how to install it, or, with
// INBOX_REQUIRE_SERVICES=1, fails.
func Program(t testing.TB, name, how string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	msg := fmt.Sprintf("%s not found (%v): %s", name, err, how)
	if RequireServices() {
		t.Fatalf("%s; INBOX_REQUIRE_SERVICES is set, so this is a failure", msg)
	}
	RecordSkip(name, how)
	t.Skip(msg)
	return ""
}

// fileMu serialises the appends of RecordSkip and Report.
var fileMu sync.Mutex

// RecordSkip appends "name: how" to the file named by INBOX_SKIP_FILE, for
// the one-line summary `make test` prints. Tests that skip for other reasons
// than a service (a capability a server lacks) call it too.
func RecordSkip(name, how string) {
	_ = appendLine("INBOX_SKIP_FILE", fmt.Sprintf("%s (%s)", name, how))
}

// appendLine appends line to the file named by the environment variable
// env, if it is set.
func appendLine(env, line string) error {
	path := os.Getenv(env)
	if path == "" {
		return nil
	}
	fileMu.Lock()
	defer fileMu.Unlock()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(f, line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Report logs line on t and appends "test: line" to the file named by
// INBOX_REPORT_FILE, which `make test` prints at its end: for the few
// figures a test measures that a reader of CI's output should see (go test
// shows a passing test's log only with -v).
func Report(t testing.TB, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	if err := appendLine("INBOX_REPORT_FILE", t.Name()+": "+line); err != nil {
		t.Errorf("INBOX_REPORT_FILE: %v", err)
	}
}

// Eventually polls cond until it holds, and fails the test, naming what it
// waited for, when it still does not after within. The polling interval
// only sets how soon a true condition is seen: cond decides.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(within)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %s waiting for: %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
