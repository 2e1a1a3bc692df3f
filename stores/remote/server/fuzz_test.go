package server_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox/stores/remote/server"
)

var fuzzPaths = []string{"try-begin", "mark-processed", "release", "extend", "fail", "list", "forget", "force-release"}

// checkAnswer asserts what every answer of the server must be: JSON, never a
// redirect, never a 5xx over a healthy store, a known status on 200 and an
// error code with a message otherwise.
func checkAnswer(t *testing.T, what string, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code >= 300 && rec.Code < 400 || rec.Code >= 500 {
		t.Fatalf("%s: answered %d %s", what, rec.Code, rec.Body)
	}
	var m map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil {
		t.Fatalf("%s: answer %d is not a JSON object: %q", what, rec.Code, rec.Body)
	}
	if rec.Code == 200 {
		if _, ok := m["items"].([]any); ok && m["status"] == nil { // list
			return
		}
		switch m["status"] {
		case "Acquired", "Busy", "Processed", "Dead", "Released", "Extended", "LeaseLost", "Forgotten", "NotFound", "Available", "InProgress":
		default:
			t.Fatalf("%s: 200 with status %v", what, m["status"])
		}
		return
	}
	code, _ := m["error"].(string)
	msg, _ := m["message"].(string)
	if code == "" || msg == "" {
		t.Fatalf("%s: %d without error code and message: %v", what, rec.Code, m)
	}
}

func FuzzServer_request_body(f *testing.F) {
	for i, b := range []string{`{"key":"k","leaseSeconds":30,"leaseId":"x"}`, `{"key":"k"}`, `{"key":"k","leaseId":"x","leaseSeconds":5}`,
		`{"key":"","leaseSeconds":1e400}`, `{`, `{"key":"a\u0000"}`, `{"key":"k","owner":null,"payloadHash":"h"}`,
		`{"key":"k","leaseId":"x","retryAfterMs":5,"dead":true,"reason":"r"}`, `{"prefix":"k","state":"Dead","limit":5,"olderThanMs":1,"cursor":"a"}`,
		`{"key":"k","acceptDead":true}`} {
		f.Add(uint8(i), []byte(b))
	}
	h := newServer(f, server.Config{AdminNoAuth: true})
	f.Fuzz(func(t *testing.T, ep uint8, body []byte) {
		path := "/v1/inbox/" + fuzzPaths[int(ep)%len(fuzzPaths)]
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.Host = "127.0.0.1:8080"
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, req)
		checkAnswer(t, path, rec)
		if rec.Code == http.StatusForbidden || rec.Code == http.StatusUnsupportedMediaType {
			t.Fatalf("%s: %d %s: the body never reached the operation", path, rec.Code, rec.Body)
		}
	})
}

func FuzzServer_key_path(f *testing.F) {
	for _, p := range []string{"k", "%2E%2E", "..", "a/../b", "%25", "%zz", "", "%", "a%2Fb", "%C3%A9", "%00"} {
		f.Add(p)
	}
	h := newServer(f, server.Config{})
	f.Fuzz(func(t *testing.T, rawKey string) {
		if strings.ContainsAny(rawKey, " \r\n\t?#") {
			return // not a request path an HTTP parser would hand over
		}
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.URL.Path, req.URL.RawPath = "", ""
		req.URL.Opaque = ""
		req.RequestURI = "/v1/inbox/" + rawKey
		u, err := req.URL.Parse(req.RequestURI)
		if err != nil {
			return // Go's server answers 400 before any handler
		}
		req.URL = u
		req.Host = "127.0.0.1:8080"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		checkAnswer(t, "GET "+req.RequestURI, rec)
		if rec.Code == http.StatusForbidden {
			t.Fatalf("GET %s: 403 %s: the key never reached the store", req.RequestURI, rec.Body)
		}
	})
}
