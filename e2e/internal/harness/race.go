//go:build race

package harness

// raceEnabled says the test binary was built with -race: inboxctl is built
// the same way, so that its packages come from the build cache.
const raceEnabled = true
