// Package dialect is the seam between package sqlstore, which speaks
// database/sql alone, and the dialect packages (stores/sql/postgres,
// stores/sql/mysql, stores/sql/sqlite), each of which imports one
// database/sql driver and registers here, in its init, what the store needs
// from that driver: how a URL names a database, and what the driver's errors
// mean. A program links the drivers of the dialect packages it imports, and
// no other.
package dialect

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"sync"

	"github.com/watermill-inbox/inbox/stores"
)

// Kind classifies an error of a database driver.
type Kind int

// The kinds of driver errors the store acts on.
const (
	Other           Kind = iota
	Retry                // deadlock or serialization failure: the statement was rolled back, run it again
	LockWait             // lock wait timeout
	NoTable              // the table does not exist
	Duplicate            // unique violation
	NoColumn             // a column does not exist
	DuplicateColumn      // ALTER TABLE ADD COLUMN of a column that exists
)

// Target names what a URL opens, for the messages of the check at Open:
// database, server and user; never a password.
type Target struct {
	Dialect  string
	Database string // the database name, or the SQLite file
	Server   string // host:port; empty for SQLite
	User     string
}

func (t Target) String() string {
	if t.Dialect == "sqlite" {
		return "SQLite database " + t.Database
	}
	s := fmt.Sprintf("database %s at %s", t.Database, t.Server)
	if t.User != "" {
		s += " as user " + t.User
	}
	return s
}

// MissingTable says that table is missing from t and how to create it.
func MissingTable(t Target, table string) string {
	return fmt.Sprintf("table %s does not exist in %s: add migrate=true to the URL, run Store.Migrate, or apply the statements of sqlstore.DDL", table, t)
}

// WrongTable says that table in t is not an inbox table of this version.
func WrongTable(t Target, table string) string {
	return fmt.Sprintf("table %s in %s is not an inbox table of this version (a column is missing or of another type): use another table name, or migrate it to the statements of sqlstore.DDL", table, t)
}

// Driver is what a dialect package registers: its database/sql driver's
// side of the store.
type Driver struct {
	// Dialect is the name of the sqlstore.Dialect: "postgres", "mysql" or
	// "sqlite".
	Dialect string

	// Schemes are the URL schemes the dialect registers with package
	// stores; SecretParams the URL parameters that carry secrets
	// (stores.RegisterSecretParams).
	Schemes      []string
	SecretParams []string

	// Params are the driver's own URL parameters. The store reads its own
	// (table, migrate, ...), rejects any parameter that is neither, and
	// passes the URL to Connect with Params alone in its query.
	Params []string

	// Connect opens the database a URL names, without contacting it.
	// Errors wrap stores.ErrInvalidURL and quote no password.
	Connect func(u *url.URL) (*sql.DB, Target, error)

	// Classify says what an error of the driver means (Other for an error
	// that is not the driver's).
	Classify func(err error) Kind

	// Cause returns the driver's own error in err's chain (a server's
	// error, a failed connection), or nil.
	Cause func(err error) error

	// Misconfiguration returns what is wrong and how to fix it when err,
	// met while opening t, is a mistake of configuration, or "".
	Misconfiguration func(t Target, table string, err error) string
}

// OpenURL opens the store a URL of d's schemes names. Package sqlstore,
// which every dialect package imports, sets it in its init.
var OpenURL func(ctx context.Context, u *url.URL, p stores.Params, d *Driver) (stores.Store, error)

var (
	mu      sync.RWMutex
	drivers []*Driver
)

// Register registers d, and its URL schemes with package stores. A dialect
// package calls it from its init; registering a dialect twice panics.
func Register(d *Driver) {
	mu.Lock()
	for _, r := range drivers {
		if r.Dialect == d.Dialect {
			mu.Unlock()
			panic("sqlstore: dialect " + d.Dialect + " registered twice")
		}
	}
	drivers = append(drivers, d)
	mu.Unlock()
	stores.RegisterSecretParams(d.SecretParams...)
	open := stores.OpenerFunc(func(ctx context.Context, u *url.URL, p stores.Params) (stores.Store, error) {
		return OpenURL(ctx, u, p, d)
	})
	for _, s := range d.Schemes {
		stores.Register(s, open)
	}
}

// Lookup returns the registered driver of a dialect, or nil.
func Lookup(dialect string) *Driver {
	mu.RLock()
	defer mu.RUnlock()
	for _, d := range drivers {
		if d.Dialect == dialect {
			return d
		}
	}
	return nil
}

// Classify says what err means to the driver whose error it is.
func Classify(err error) Kind {
	mu.RLock()
	defer mu.RUnlock()
	for _, d := range drivers {
		if k := d.Classify(err); k != Other {
			return k
		}
	}
	return Other
}

// Cause returns the driver's own error in err's chain, or nil.
func Cause(err error) error {
	mu.RLock()
	defer mu.RUnlock()
	for _, d := range drivers {
		if c := d.Cause(err); c != nil {
			return c
		}
	}
	return nil
}
