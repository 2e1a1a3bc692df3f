package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/watermill-inbox/inbox/stores/memory"
	"github.com/watermill-inbox/inbox/stores/remote/server"
)

func ExampleNew() {
	store, err := memory.New(memory.Options{Retention: 7 * 24 * time.Hour})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	h, err := server.New(server.Config{
		Store:       store,
		Token:       "a-secret-token-0001", // from a file or the environment in real use
		LeaseMin:    10 * time.Second,
		LeasePolicy: server.PolicyReject,
		Logger:      slog.New(slog.NewJSONHandler(os.Stderr, nil)),
	})
	if err != nil {
		panic(err)
	}
	// In a program: srv := &http.Server{Addr: ..., Handler: h, ReadHeaderTimeout: 5 * time.Second}
	srv := httptest.NewServer(h)
	defer srv.Close()

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/inbox/try-begin", strings.NewReader(`{"key":"k","leaseSeconds":5}`))
	req.Header.Set("Authorization", "Bearer a-secret-token-0001")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Print(resp.StatusCode, " ", string(body))
	// Output: 400 {"error":"invalid_lease","message":"leaseSeconds 5 is outside the server's range [10, 120]"}
}

// A token rotation without refused requests: the server accepts the old and
// the new token while clients move, then the new one only.
func ExampleServer_SetTokens() {
	store, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	h, err := server.New(server.Config{Store: store, Token: "old-token-000000001"})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	status := func(token string) int {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/inbox/k", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	if err := h.SetTokens("old-token-000000001", "new-token-000000001"); err != nil { // both while clients move
		panic(err)
	}
	fmt.Println(status("old-token-000000001"), status("new-token-000000001"))
	if err := h.SetTokens("new-token-000000001"); err != nil { // every client has moved
		panic(err)
	}
	fmt.Println(status("old-token-000000001"), status("new-token-000000001"))
	// Output:
	// 200 200
	// 401 200
}

// A consumer's token limited to the keys of its own consumers, and an
// operator's token for the admin endpoints, which a consumer's token may
// not call.
func ExampleGrant() {
	store, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	h, err := server.New(server.Config{
		Store:       store,
		Grants:      []server.Grant{{Token: "billing-token-0001", Prefixes: []string{"rabbit:billing:"}}},
		AdminTokens: []string{"operator-token-0001"}, // from files in real use
	})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	post := func(token, path, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		var answer struct{ Status, Error string }
		_ = json.NewDecoder(resp.Body).Decode(&answer)
		fmt.Println(path, resp.StatusCode, answer.Status+answer.Error)
	}

	post("billing-token-0001", "/v1/inbox/try-begin", `{"key":"rabbit:billing:invoice-handler:42"}`)
	post("billing-token-0001", "/v1/inbox/try-begin", `{"key":"rabbit:shipping:label-handler:42"}`)
	post("billing-token-0001", "/v1/inbox/forget", `{"key":"rabbit:billing:invoice-handler:42"}`)
	post("operator-token-0001", "/v1/inbox/forget", `{"key":"rabbit:billing:invoice-handler:42"}`)
	// Output:
	// /v1/inbox/try-begin 200 Acquired
	// /v1/inbox/try-begin 403 forbidden
	// /v1/inbox/forget 403 forbidden
	// /v1/inbox/forget 200 Forgotten
}
