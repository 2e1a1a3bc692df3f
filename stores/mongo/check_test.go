package mongostore_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
)

const checkSecret = "s3cr3t-Mongo-pw"

// A server that does not answer fails Open as unavailable (not as a
// mistake of configuration), naming where; with check=false the store opens
// and its first call fails the same way. No error quotes the password.
func TestOpenURL_unreachable(t *testing.T) {
	t.Parallel()
	raw := "mongodb://app:" + checkSecret + "@127.0.0.1:1/app?timeout=1s"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := stores.Open(ctx, raw)
	if !errors.Is(err, inbox.ErrStoreUnavailable) || errors.Is(err, stores.ErrMisconfigured) {
		t.Fatalf("Open of a closed port: %v; want ErrStoreUnavailable, not ErrMisconfigured", err)
	}
	for _, want := range []string{"cannot reach 127.0.0.1:1", "check=false"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open: error does not say %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), checkSecret) {
		t.Errorf("Open: error quotes the password: %v", err)
	}

	s, err := stores.Open(ctx, raw+"&check=false")
	if err != nil {
		t.Fatalf("Open with check=false: %v", err)
	}
	defer s.Close()
	_, err = s.TryBegin(ctx, "k", inbox.BeginOptions{})
	if !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Fatalf("first call of a store opened with check=false: %v; want ErrStoreUnavailable", err)
	}
	if strings.Contains(err.Error(), checkSecret) {
		t.Errorf("first call: error quotes the password: %v", err)
	}
	if _, err := s.Get(ctx, ""); !errors.Is(err, inbox.ErrInvalidKey) {
		t.Errorf("Get of an empty key: %v; want ErrInvalidKey", err)
	}
}

// check=false sends nothing at Open, ensure_indexes=true included: the
// TTL index is created at the first call, which reads the server's clock.
func TestOpenURL_check_false_defers_the_TTL_index(t *testing.T) {
	t.Parallel()
	s, err := stores.Open(context.Background(), "mongodb://127.0.0.1:1/app?ensure_indexes=true&check=false&serverSelectionTimeoutMS=100")
	if err != nil {
		t.Fatalf("Open with ensure_indexes=true and check=false: %v; want a store, as nothing is sent", err)
	}
	_ = s.Close()
}

// The driver's log, turned on by MONGODB_LOG_ALL, goes to the store's
// Watermill logger (slog's default one for a URL), never to standard error:
// the test binary runs itself with the variable set.
func TestOpenURL_driver_log_goes_to_the_logger(t *testing.T) {
	t.Parallel()
	if os.Getenv("MONGOSTORE_LOG_CHILD") == "1" {
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOpenURL_driver_log_child$", "-test.count=1")
	cmd.Env = append(os.Environ(), "MONGOSTORE_LOG_CHILD=1", "MONGODB_LOG_ALL=debug")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("child: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "mongo driver:") || !strings.Contains(stdout.String(), "source=mongo-driver") {
		t.Fatalf("the driver's log did not reach the logger; child's output:\n%s", stdout.String())
	}
	if stderr.Len() != 0 {
		t.Fatalf("the driver wrote to standard error:\n%s", stderr.String())
	}
}

// TestOpenURL_driver_log_child is the child of the test above.
func TestOpenURL_driver_log_child(t *testing.T) {
	if os.Getenv("MONGOSTORE_LOG_CHILD") != "1" {
		t.Skip("runs as the child of TestOpenURL_driver_log_goes_to_the_logger")
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if s, err := stores.Open(context.Background(), "mongodb://127.0.0.1:1/app?timeout=300ms"); err == nil {
		_ = s.Close()
		t.Fatal("Open of a closed port succeeded")
	}
}
