package server_test

import (
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
		Token:       "a-secret-token", // from a file or the environment in real use
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
	req.Header.Set("Authorization", "Bearer a-secret-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Print(resp.StatusCode, " ", string(body))
	// Output: 400 {"error":"invalid_lease","message":"leaseSeconds 5 is outside the server's range [10, 120]"}
}
