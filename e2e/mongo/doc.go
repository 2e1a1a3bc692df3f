// Package mongo runs the end-to-end suite (package
// github.com/watermill-inbox/inbox/e2e) on the MongoDB store: against
// FerretDB v1.24 embedded in the test process, and against a real mongod when
// INBOX_TEST_MONGO_URL is set.
//
// It is a module of its own because FerretDB builds only with the
// modernc.org/sqlite and modernc.org/libc versions it was released with,
// older than those the SQL store needs: go.mod pins them, the way module
// stores/mongo/ferrettest does. This module never compiles the SQL store.
package mongo
