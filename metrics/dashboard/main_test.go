package main

import (
	"bytes"
	"os"
	"testing"
)

// The checked-in dashboard is exactly what the generator writes: byte for
// byte, so that a hand edit of the JSON, or a change of the generator or
// of the SDK's version without regenerating, fails.
func TestDashboardJSON_is_generated(t *testing.T) {
	t.Parallel()
	want, err := dashboardJSON()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("metrics/dashboard.json is not what the generator writes (%d bytes, the generator %d, first difference at byte %d): run `go generate` in metrics/dashboard and commit the result",
			len(got), len(want), firstDifference(got, want))
	}
}

func firstDifference(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
