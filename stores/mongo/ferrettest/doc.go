// Package ferrettest runs the MongoDB store's tests and benchmarks against
// FerretDB v1.24 embedded in the test process (SQLite handler, state in a
// temporary directory, telemetry off, listening on a free loopback port).
//
// It is a module of its own because FerretDB pins modernc.org/sqlite and
// modernc.org/libc to versions that newer ones do not build with: the replace
// directives in go.mod keep them at FerretDB's versions whatever the library
// module requires. This module never compiles the library's SQL store, so the
// pin is safe.
//
// FerretDB runs every functional case of the conformance suite; its updates
// are not atomic under concurrency, so the suite's concurrency cases skip
// here. See package [github.com/watermill-inbox/inbox/stores/mongo] for what
// was verified where.
package ferrettest
