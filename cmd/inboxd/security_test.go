package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores/remote"
)

// writeFile writes text to a new file of the test's and returns its path.
func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// send is one request to inboxd, as curl sends it: method, URL, headers
// (name, value, ...; "Host" sets the Host header), body. It returns the code
// and the body.
func send(t *testing.T, method, url, body string, hdr ...string) (int, string) {
	t.Helper()
	code, b, _ := sendH(t, method, url, body, hdr...)
	return code, b
}

// sendH is send that returns the answer's header too.
func sendH(t *testing.T, method, url, body string, hdr ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// The findings of issue 23 against inboxd, re-tried as the issue's curl
// commands send them (curl -d sends application/x-www-form-urlencoded
// unless told otherwise): every one is refused with a 4xx and the protocol's
// JSON error body, and changes nothing.
func TestRun_issue23_findings_are_refused(t *testing.T) {
	t.Parallel()

	// Without a token, on loopback (the default): a web page.
	addr, _, _, _ := startRun(t, map[string]string{"INBOX_LISTEN_ADDR": "127.0.0.1:0"})
	base := "http://" + addr
	if code, body := send(t, "POST", base+"/v1/inbox/mark-processed", `{"key":"order:42"}`, "Content-Type", "application/json"); code != 200 {
		t.Fatalf("marking order:42 as a client does: %d %s", code, body)
	}
	for _, c := range []struct {
		what, method, path, body string
		hdr                      []string
		code                     int
	}{
		// curl -XPOST 127.0.0.1:PORT/v1/inbox/forget -H 'Content-Type: text/plain' -H 'Origin: http://attacker.example' -d '{"key":"order:42"}'
		{"the issue's cross-site forget", "POST", "/v1/inbox/forget", `{"key":"order:42"}`, []string{"Content-Type", "text/plain", "Origin", "http://attacker.example"}, 403},
		{"a cross-site form POST", "POST", "/v1/inbox/force-release", `{"key":"order:42"}`, []string{"Content-Type", "application/x-www-form-urlencoded", "Origin", "http://attacker.example"}, 403},
		{"a cross-site mark", "POST", "/v1/inbox/mark-processed", `{"key":"order:43"}`, []string{"Content-Type", "text/plain", "Origin", "null"}, 403},
		{"a text/plain forget without Origin", "POST", "/v1/inbox/forget", `{"key":"order:42"}`, []string{"Content-Type", "text/plain"}, 415},
		{"curl -d's form encoding", "POST", "/v1/inbox/forget", `{"key":"order:42"}`, []string{"Content-Type", "application/x-www-form-urlencoded"}, 415},
		{"DNS rebinding reads list", "POST", "/v1/inbox/list", `{}`, []string{"Content-Type", "application/json", "Host", "attacker.example:" + addr[strings.LastIndex(addr, ":")+1:]}, 403},
		{"DNS rebinding reads a key", "GET", "/v1/inbox/order:42", ``, []string{"Host", "attacker.example"}, 403},
		{"DNS rebinding reads metrics", "GET", "/metrics", ``, []string{"Host", "attacker.example"}, 403},
		{"invalid UTF-8 in a key", "POST", "/v1/inbox/mark-processed", "{\"key\":\"order:\xff\"}", []string{"Content-Type", "application/json"}, 400},
		{"an escaped lone surrogate", "POST", "/v1/inbox/mark-processed", `{"key":"order:\udc00"}`, []string{"Content-Type", "application/json"}, 400},
		{"duplicate fields", "POST", "/v1/inbox/forget", `{"key":"order:1","key":"order:42"}`, []string{"Content-Type", "application/json"}, 400},
	} {
		code, body := send(t, c.method, base+c.path, c.body, c.hdr...)
		var e struct{ Error, Message string }
		if code != c.code || json.Unmarshal([]byte(body), &e) != nil || e.Error == "" || e.Message == "" {
			t.Errorf("%s: %d %s, want %d with a JSON error body", c.what, code, body, c.code)
		}
	}
	if code, body := send(t, "GET", base+"/v1/inbox/order:42", ""); code != 200 || !strings.Contains(body, `"Processed"`) {
		t.Fatalf("order:42 after the refused requests: %d %s, want it still processed", code, body)
	}
	for _, key := range []string{"order:43", "order:%EF%BF%BD"} {
		if code, body := send(t, "GET", base+"/v1/inbox/"+key, ""); code != 200 || !strings.Contains(body, `"NotFound"`) {
			t.Fatalf("%s after the refused requests: %d %s, want NotFound", key, code, body)
		}
	}

	// With tokens: a consumer's token against the operators' endpoints and
	// other consumers' keys; /metrics without a token; an unbounded backoff.
	consumers := writeFile(t, "tokens", "billing-consumer-token prefix=rabbit:billing:\n")
	admins := writeFile(t, "admin-tokens", "operator-token-0001\n")
	addr, _, _, _ = startRun(t, map[string]string{"INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_TOKEN_FILE": consumers,
		"INBOX_ADMIN_TOKEN_FILE": admins, "INBOX_LEASE_POLICY": "reject", "INBOX_LEASE_MIN": "1s"})
	base = "http://" + addr
	consumer := []string{"Content-Type", "application/json", "Authorization", "Bearer billing-consumer-token"}
	operator := []string{"Content-Type", "application/json", "Authorization", "Bearer operator-token-0001"}
	if code, body := send(t, "POST", base+"/v1/inbox/try-begin", `{"key":"rabbit:shipping:h:1","leaseId":"S","owner":"shipping"}`, operator...); code != 200 {
		t.Fatalf("another consumer's lease: %d %s", code, body)
	}
	for _, c := range []struct {
		what, method, path, body string
		code                     int
	}{
		{"a consumer lists every key", "POST", "/v1/inbox/list", `{}`, 403},
		{"a consumer force-releases another's lease", "POST", "/v1/inbox/force-release", `{"key":"rabbit:shipping:h:1"}`, 403},
		{"a consumer forgets a key", "POST", "/v1/inbox/forget", `{"key":"rabbit:shipping:h:1"}`, 403},
		{"a consumer marks another's key", "POST", "/v1/inbox/mark-processed", `{"key":"rabbit:shipping:h:1"}`, 403},
		{"a consumer reads another's key", "GET", "/v1/inbox/rabbit:shipping:h:1", ``, 403},
		{"a backoff in the year 2319", "POST", "/v1/inbox/fail", `{"key":"rabbit:billing:h:1","leaseId":"B","retryAfterMs":9999999999999}`, 400},
	} {
		if c.what == "a backoff in the year 2319" {
			if code, body := send(t, "POST", base+"/v1/inbox/try-begin", `{"key":"rabbit:billing:h:1","leaseId":"B"}`, consumer...); code != 200 {
				t.Fatalf("try-begin: %d %s", code, body)
			}
		}
		if code, body := send(t, c.method, base+c.path, c.body, consumer...); code != c.code {
			t.Errorf("%s: %d %s, want %d", c.what, code, body, c.code)
		}
	}
	if code, body := send(t, "GET", base+"/metrics", ""); code != 401 {
		t.Errorf("/metrics without a token: %d %.200s, want 401", code, body)
	}
	if code, body := send(t, "GET", base+"/v1/inbox/rabbit:shipping:h:1", "", operator...); code != 200 || !strings.Contains(body, `"InProgress"`) || !strings.Contains(body, `"shipping"`) {
		t.Fatalf("the other consumer's lease after the refused calls: %d %s", code, body)
	}
}

// The admin token file: its tokens, and only they, may call list, forget
// and force-release; a consumer's token gets 403 there, through the remote
// client too. It is reloaded on SIGHUP like the consumers' file; a token in
// both files is refused at start and at a reload.
func TestRun_admin_token_file(t *testing.T) {
	t.Parallel()
	consumers := writeFile(t, "tokens", "consumer-token-0001\n")
	admins := writeFile(t, "admin-tokens", "admin-token-0001\n")
	if _, err := parse(nil, env(map[string]string{"INBOX_TOKEN_FILE": consumers, "INBOX_ADMIN_TOKEN_FILE": writeFile(t, "both", "admin-token-000x\nconsumer-token-0001\n")})); err == nil ||
		!strings.Contains(err.Error(), "INBOX_ADMIN_TOKEN_FILE") || strings.Contains(err.Error(), "consumer-token-0001") {
		t.Fatalf("a consumer's token in the admin file: %v, want an error that names the files, not the token", err)
	}
	if _, err := parse(nil, env(map[string]string{"INBOX_ADMIN_TOKEN_FILE": writeFile(t, "prefixed", "admin-token prefix=a:\n")})); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("an admin token with a prefix: %v, want an error naming the line", err)
	}

	reload := make(chan os.Signal, 1)
	addr, logs, _, _ := startRunReloadable(t, map[string]string{
		"INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_TOKEN_FILE": consumers, "INBOX_ADMIN_TOKEN_FILE": admins,
	}, reload)
	if !strings.Contains(logs.String(), `"admin":"token"`) || !strings.Contains(logs.String(), `"metrics":"token"`) {
		t.Fatalf("the listening line does not say admin and metrics need a token:\n%s", logs)
	}
	ctx := context.Background()
	client := func(token string) *remote.Store {
		s, err := remote.New(remote.Options{URL: "http://" + addr, Token: token, Retries: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	consumer, admin := client("consumer-token-0001"), client("admin-token-0001")
	c, err := consumer.TryBegin(ctx, "k", inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin with the consumer's token: %+v, %v", c, err)
	}
	if err := consumer.ForceRelease(ctx, "k"); !errors.Is(err, remote.ErrUnauthorized) || !strings.Contains(err.Error(), "403") {
		t.Fatalf("ForceRelease with the consumer's token: %v, want a 403 wrapping ErrUnauthorized", err)
	}
	if _, err := consumer.List(ctx, inbox.ListOptions{}); !errors.Is(err, remote.ErrUnauthorized) {
		t.Fatalf("List with the consumer's token: %v", err)
	}
	if err := admin.ForceRelease(ctx, "k"); err != nil {
		t.Fatalf("ForceRelease with the admin's token: %v", err)
	}
	if p, err := admin.List(ctx, inbox.ListOptions{}); err != nil || len(p.Items) != 1 {
		t.Fatalf("List with the admin's token: %+v, %v", p, err)
	}

	reloads := 0
	doReload := func(want string) {
		t.Helper()
		reloads++
		reload <- syscall.SIGHUP
		testenv.Eventually(t, 10*time.Second, "reload logged", func() bool {
			return strings.Count(logs.String(), `"msg":"inboxd reloaded"`) == reloads
		})
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("reload %d: logs lack %s:\n%s", reloads, want, logs)
		}
	}
	write := func(file, text string) {
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(admins, "admin-token-0002\n")
	doReload(`"admin_tokens":1`)
	if err := admin.Forget(ctx, "k"); !errors.Is(err, remote.ErrUnauthorized) {
		t.Fatalf("Forget with the admin token that left the file: %v", err)
	}
	if err := client("admin-token-0002").Forget(ctx, "k"); err != nil {
		t.Fatalf("Forget with the new admin token: %v", err)
	}
	// A token moves from the consumers' file to the admins' in one reload.
	write(consumers, "consumer-token-0002\n")
	write(admins, "consumer-token-0001\n")
	doReload(`"admin_tokens":1`)
	if err := client("consumer-token-0001").Forget(ctx, "k"); err != nil {
		t.Fatalf("Forget with the token moved to the admin file: %v", err)
	}
	if _, err := client("consumer-token-0002").Get(ctx, "k"); err != nil {
		t.Fatalf("Get with the new consumer token: %v", err)
	}
	// A token in both files: the reload keeps the tokens as they were.
	write(admins, "consumer-token-0002\n")
	doReload(`"complete":false`)
	if err := client("consumer-token-0001").Forget(ctx, "k"); err != nil {
		t.Fatalf("after a refused reload, the admin token: %v", err)
	}
	if strings.Contains(logs.String(), "consumer-token") || strings.Contains(logs.String(), "admin-token") {
		t.Fatalf("the logs hold a token:\n%s", logs)
	}
}

// A token file line may limit its token to key prefixes; a line that is not
// "token [prefix=...]..." is refused at start, by its number, never quoted.
func TestRun_token_file_prefixes(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "tokens", "billing-token-0001 prefix=rabbit:billing: prefix=kafka:billing:\n\nfree-token-000001\n")
	addr, _, _, _ := startRun(t, map[string]string{"INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_TOKEN_FILE": file})
	ctx := context.Background()
	s, err := remote.New(remote.Options{URL: "http://" + addr, Token: "billing-token-0001", Retries: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, key := range []string{"rabbit:billing:h:1", "kafka:billing:h:1"} {
		if c, err := s.TryBegin(ctx, key, inbox.BeginOptions{}); err != nil || c.Status != inbox.Acquired {
			t.Fatalf("TryBegin(%s) with the billing token: %+v, %v", key, c, err)
		}
	}
	for _, key := range []string{"rabbit:shipping:h:1", "rabbit:billing"} {
		if _, err := s.TryBegin(ctx, key, inbox.BeginOptions{}); !errors.Is(err, remote.ErrUnauthorized) {
			t.Fatalf("TryBegin(%s) with the billing token: %v, want 403", key, err)
		}
		if _, err := s.Get(ctx, key); !errors.Is(err, remote.ErrUnauthorized) {
			t.Fatalf("Get(%s) with the billing token: %v, want 403", key, err)
		}
	}
	free, err := remote.New(remote.Options{URL: "http://" + addr, Token: "free-token-000001"})
	if err != nil {
		t.Fatal(err)
	}
	defer free.Close()
	if c, err := free.TryBegin(ctx, "rabbit:shipping:h:1", inbox.BeginOptions{}); err != nil || c.Status != inbox.Acquired {
		t.Fatalf("a token without prefixes: %+v, %v", c, err)
	}
	for name, text := range map[string]string{
		"unknown field": "tok-a-0000000001\ntok-secret-b-000001 prefx=a:\n",
		"empty prefix":  "tok-a-0000000001\ntok-secret-b-000001 prefix=\n",
		"token twice":   "tok-secret-b-000001\ntok-a-0000000001\ntok-secret-b-000001 prefix=a:\n",
	} {
		_, err := parse(nil, env(map[string]string{"INBOX_TOKEN_FILE": writeFile(t, "bad", text)}))
		if err == nil || !strings.Contains(err.Error(), "line ") || strings.Contains(err.Error(), "tok-secret-b-000001") {
			t.Errorf("%s: %v, want an error naming the line, not the token", name, err)
		}
	}
}

// Tokens served over plain HTTP on an address that is not loopback: a
// warning at start. Not on loopback, not with TLS, not without tokens.
func TestRun_warns_of_tokens_in_clear(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "tokens", "a-token-000000001\n")
	warned := func(vars map[string]string) bool {
		_, logs, stop, result := startRun(t, vars)
		stop()
		if err := <-result; err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(logs.String(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(l), &rec) == nil && rec["level"] == "WARN" && strings.Contains(fmt.Sprint(rec["msg"]), "plain HTTP") {
				return true
			}
		}
		return false
	}
	if !warned(map[string]string{"INBOX_LISTEN_ADDR": "0.0.0.0:0", "INBOX_TOKEN_FILE": file}) {
		t.Error("no warning for tokens over plain HTTP on 0.0.0.0")
	}
	if !warned(map[string]string{"INBOX_LISTEN_ADDR": "0.0.0.0:0", "INBOX_ADMIN_TOKEN_FILE": file, "INBOX_ALLOW_NO_AUTH": "true", "INBOX_ALLOWED_HOSTS": "inboxd.internal"}) {
		t.Error("no warning for admin tokens over plain HTTP on 0.0.0.0")
	}
	if warned(map[string]string{"INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_TOKEN_FILE": file}) {
		t.Error("a warning for tokens on loopback")
	}
	certFile, keyFile, _ := selfSigned(t)
	if warned(map[string]string{"INBOX_LISTEN_ADDR": "0.0.0.0:0", "INBOX_TOKEN_FILE": file, "INBOX_TLS_CERT_FILE": certFile, "INBOX_TLS_KEY_FILE": keyFile}) {
		t.Error("a warning with TLS")
	}
}

// /metrics needs a token when consumers do, unless INBOX_METRICS_OPEN;
// /healthz and /readyz answer without one (for probes; they say only up and
// ready).
func TestRun_metrics_need_a_token(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "tokens", "a-token-000000001\n")
	addr, _, _, _ := startRun(t, map[string]string{"INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_TOKEN_FILE": file})
	for path, want := range map[string]int{"/metrics": 401, "/healthz": 200, "/readyz": 200} {
		if code, body := send(t, "GET", "http://"+addr+path, ""); code != want {
			t.Errorf("GET %s without a token: %d %.100s, want %d", path, code, body, want)
		}
	}
	if code, _ := send(t, "GET", "http://"+addr+"/metrics", "", "Authorization", "Bearer a-token-000000001"); code != 200 {
		t.Errorf("/metrics with the token: %d", code)
	}
	addr, logs, _, _ := startRun(t, map[string]string{"INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_TOKEN_FILE": file, "INBOX_METRICS_OPEN": "true"})
	if code, _ := send(t, "GET", "http://"+addr+"/metrics", ""); code != 200 {
		t.Errorf("/metrics with INBOX_METRICS_OPEN=true: %d", code)
	}
	if !strings.Contains(logs.String(), `"metrics":"open"`) {
		t.Errorf("the listening line does not say metrics open:\n%s", logs)
	}
	if _, err := parse(nil, env(map[string]string{"INBOX_METRICS_OPEN": "sure"})); err == nil || !strings.Contains(err.Error(), "INBOX_METRICS_OPEN") {
		t.Errorf("INBOX_METRICS_OPEN=sure: %v", err)
	}
}

// Without any token, on loopback, the admin endpoints are served (inboxctl
// on the same machine); with INBOX_ALLOW_NO_AUTH on another address they
// are off, and the Host check lets in only the allowed names.
func TestRun_no_auth_admin_and_allowed_hosts(t *testing.T) {
	t.Parallel()
	addr, logs, _, _ := startRun(t, map[string]string{"INBOX_LISTEN_ADDR": "127.0.0.1:0"})
	if code, body := send(t, "POST", "http://"+addr+"/v1/inbox/list", `{}`, "Content-Type", "application/json"); code != 200 {
		t.Fatalf("list without a token on loopback: %d %s", code, body)
	}
	if !strings.Contains(logs.String(), `"admin":"open"`) {
		t.Fatalf("listening line:\n%s", logs)
	}
	addr, logs, _, _ = startRun(t, map[string]string{"INBOX_LISTEN_ADDR": "0.0.0.0:0", "INBOX_ALLOW_NO_AUTH": "true", "INBOX_ALLOWED_HOSTS": "inboxd.internal"})
	port := addr[strings.LastIndex(addr, ":")+1:]
	local := "http://127.0.0.1:" + port
	if code, body := send(t, "POST", local+"/v1/inbox/list", `{}`, "Content-Type", "application/json"); code != 403 || !strings.Contains(body, "INBOX_ADMIN_TOKEN_FILE") {
		t.Fatalf("list without a token off loopback: %d %s, want 403 naming INBOX_ADMIN_TOKEN_FILE", code, body)
	}
	if !strings.Contains(logs.String(), `"admin":"off"`) {
		t.Fatalf("listening line:\n%s", logs)
	}
	for host, want := range map[string]int{"inboxd.internal:" + port: 200, "INBOXD.internal": 200, "127.0.0.1:" + port: 200, "other.internal:" + port: 403} {
		if code, body := send(t, "GET", local+"/v1/inbox/k", "", "Host", host); code != want {
			t.Errorf("GET with Host %s: %d %s, want %d", host, code, body, want)
		}
	}
}

// Issue 30, finding 3: a one-byte token was accepted; finding 4: a token
// prefix without the separator was accepted ("app" reaches "apple:1").
// Both are refused at start, naming the setting and the line, never the
// token.
func TestRun_refuses_short_tokens_and_prefixes_without_separator(t *testing.T) {
	t.Parallel()
	const long = "0123456789abcdef-long-enough"
	for name, c := range map[string]struct {
		vars map[string]string
		want []string
	}{
		"a one-byte INBOX_TOKEN":  {map[string]string{"INBOX_TOKEN": "x"}, []string{"INBOX_TOKEN", "16 bytes"}},
		"a short token in a file": {map[string]string{"INBOX_TOKEN_FILE": writeFile(t, "tokens", long+"\nshorttoken\n")}, []string{"line 2", "16 bytes", "INBOX_TOKEN_FILE"}},
		"a short admin token":     {map[string]string{"INBOX_ADMIN_TOKEN_FILE": writeFile(t, "admins", "shorttoken\n")}, []string{"line 1", "16 bytes", "INBOX_ADMIN_TOKEN_FILE"}},
		"prefix=app":              {map[string]string{"INBOX_TOKEN_FILE": writeFile(t, "tokens", long+" prefix=app:billing: prefix=app\n")}, []string{"line 1", `"app:"`, `does not end with ":"`}},
	} {
		c.vars["INBOX_LISTEN_ADDR"] = "127.0.0.1:0"
		err := startOrRefuse(t, c.vars)
		if err == nil {
			t.Errorf("%s: inboxd started", name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want an error naming %s", name, err, w)
			}
		}
		if strings.Contains(err.Error(), "shorttoken") || strings.Contains(err.Error(), long) {
			t.Errorf("%s: the error quotes a token: %v", name, err)
		}
	}
}

// Issue 30, finding 3: a token file that others may read got no warning.
// inboxd warns at start, and at a reload, naming the file and the fix; a
// file only its owner may read gets none.
func TestRun_warns_of_token_files_others_can_read(t *testing.T) {
	t.Parallel()
	const tok = "0123456789abcdef-long-enough"
	open := writeFile(t, "tokens", tok+"\n")
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	private := writeFile(t, "admins", "admin-"+tok+"\n")
	reload := make(chan os.Signal, 1)
	_, logs, _, _ := startRunReloadable(t, map[string]string{"INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_TOKEN_FILE": open, "INBOX_ADMIN_TOKEN_FILE": private}, reload)
	warnings := func() (n int, text string) {
		for _, l := range strings.Split(logs.String(), "\n") {
			var rec struct{ Level, Msg, File string }
			if json.Unmarshal([]byte(l), &rec) == nil && rec.Level == "WARN" && strings.Contains(rec.Msg, "chmod 600") {
				n++
				text += l + "\n"
			}
		}
		return n, text
	}
	n, text := warnings()
	if n != 1 || !strings.Contains(text, open) || !strings.Contains(text, "0644") || strings.Contains(text, tok) {
		t.Fatalf("start with a token file of mode 0644: %d warnings, want one naming %s and its mode:\n%s", n, open, logs)
	}
	reload <- syscall.SIGHUP
	testenv.Eventually(t, 10*time.Second, "reload logged", func() bool { return strings.Contains(logs.String(), `"msg":"inboxd reloaded"`) })
	if n, _ := warnings(); n != 2 {
		t.Fatalf("a reload of the same file: %d warnings, want 2 in all:\n%s", n, logs)
	}
}

// startOrRefuse runs inboxd with vars and returns the error it refuses to
// start with; nil when it started (it is then stopped).
func startOrRefuse(t *testing.T, vars map[string]string) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	res := make(chan error, 1)
	go func() { res <- run(ctx, nil, env(vars), io.Discard, ready, nil) }()
	select {
	case err := <-res:
		if err == nil {
			t.Fatal("run returned nil before its context ended")
		}
		return err
	case <-ready:
		cancel()
		if err := <-res; err != nil {
			t.Fatalf("stopping inboxd: %v", err)
		}
		return nil
	}
}

// The inboxd findings of issue 30, re-tried as the issue describes them
// (curl-like requests against a running inboxd): each now gets a 4xx
// answer, with Retry-After where waiting helps.
func TestRun_issue30_findings_are_refused(t *testing.T) {
	t.Parallel()
	json := []string{"Content-Type", "application/json"}
	as := func(token string) []string { return append([]string{"Authorization", "Bearer " + token}, json...) }
	retryAfter := func(what string, h http.Header) {
		t.Helper()
		if n, err := strconv.Atoi(h.Get("Retry-After")); err != nil || n < 1 {
			t.Errorf("%s: Retry-After %q, want a whole number of seconds >= 1", what, h.Get("Retry-After"))
		}
	}

	// Finding 1: on the memory store with max_entries=50, a second
	// prefix's token marking 60 keys evicted the first prefix's processed
	// key, and its redelivery ran again. Now the second token is refused
	// (429) once its share of the store is used, and the first key stays.
	const first, second = "first-tenant-token-0001", "second-tenant-token-0001"
	tokens := writeFile(t, "tokens", first+" prefix=app:first:\n"+second+" prefix=app:second:\n")
	addr, _, _, _ := startRun(t, map[string]string{"INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_TOKEN_FILE": tokens,
		"INBOX_STORE_URL": "memory://?max_entries=50", "INBOX_LEASE_MIN": "1s"})
	base := "http://" + addr
	if code, body := send(t, "POST", base+"/v1/inbox/mark-processed", `{"key":"app:first:h:1"}`, as(first)...); code != 200 {
		t.Fatalf("the first tenant marks its key: %d %s", code, body)
	}
	refused := 0
	for i := range 60 {
		code, body, h := sendH(t, "POST", base+"/v1/inbox/mark-processed", fmt.Sprintf(`{"key":"app:second:h:%d"}`, i), as(second)...)
		switch {
		case code == 429 && strings.Contains(body, `"quota_exceeded"`):
			refused++
			retryAfter("the second tenant over its share", h)
		case code != 200:
			t.Fatalf("the second tenant's mark %d: %d %s", i, code, body)
		}
	}
	if refused == 0 {
		t.Error("the second tenant marked 60 keys in a store of 50 without a refusal")
	}
	if code, body := send(t, "POST", base+"/v1/inbox/try-begin", `{"key":"app:first:h:1","leaseId":"redelivery"}`, as(first)...); code != 200 || !strings.Contains(body, `"Processed"`) {
		t.Errorf("the redelivery of the first tenant's key: %d %s, want Processed (not run again)", code, body)
	}

	// Finding 3: failed authentications were not rate-limited. Past the
	// budget (60 a minute per address by default), an address gets 429,
	// whatever token it sends, until the budget refills.
	failures := 0
	for ; failures < 100; failures++ {
		code, body, h := sendH(t, "GET", base+"/v1/inbox/app:first:h:1", "", "Authorization", "Bearer wrong-token-guess-"+strconv.Itoa(failures))
		if code == 429 {
			if !strings.Contains(body, `"too_many_auth_failures"`) {
				t.Errorf("429 after failed authentications: %s", body)
			}
			retryAfter("a guesser", h)
			break
		}
		if code != 401 {
			t.Fatalf("a wrong token: %d %s", code, body)
		}
	}
	if failures == 100 {
		t.Error("100 wrong tokens in a row from one address, none refused with 429")
	}

	// Per-token request rate: INBOX_RATE_LIMIT requests a second.
	addr, _, _, _ = startRun(t, map[string]string{"INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_TOKEN_FILE": tokens, "INBOX_RATE_LIMIT": "5"})
	limited := false
	for i := 0; i < 100 && !limited; i++ {
		code, body, h := sendH(t, "GET", "http://"+addr+"/v1/inbox/app:first:h:1", "", as(first)...)
		if code == 429 {
			limited = strings.Contains(body, `"rate_limited"`)
			retryAfter("a token over its rate", h)
		} else if code != 200 {
			t.Fatalf("GET under the rate limit: %d %s", code, body)
		}
	}
	if !limited {
		t.Error("100 requests at once with INBOX_RATE_LIMIT=5, none refused with 429 rate_limited")
	}

	// Finding 5: without a token on loopback, a request a proxy relayed
	// was served.
	addr, _, _, _ = startRun(t, map[string]string{"INBOX_LISTEN_ADDR": "127.0.0.1:0"})
	for _, hdr := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host"} {
		code, body := send(t, "POST", "http://"+addr+"/v1/inbox/mark-processed", `{"key":"order:1"}`, hdr, "203.0.113.7", "Content-Type", "application/json")
		if code != 403 || !strings.Contains(body, "proxy") {
			t.Errorf("a relayed request (%s) to inboxd without a token: %d %s, want 403 naming the proxy", hdr, code, body)
		}
	}
}
