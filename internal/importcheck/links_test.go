package importcheck_test

import (
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/watermill-inbox/inbox"

// storeDrivers are the client libraries of the stores, by module path
// prefix: a program links one only when it imports the store package that
// needs it.
var storeDrivers = map[string]string{
	"go-redis":       "github.com/redis/go-redis",
	"pgx":            "github.com/jackc/pgx",
	"go-sql-driver":  "github.com/go-sql-driver/mysql",
	"modernc sqlite": "modernc.org/sqlite",
	"mongo driver":   "go.mongodb.org/mongo-driver",
}

// stores are the store packages a user imports, each with the drivers (keys
// of storeDrivers) it may link: its own.
var stores = []struct {
	name, pkg string
	own       []string
}{
	{"memory", "stores/memory", nil},
	{"Redis", "stores/redis", []string{"go-redis"}},
	{"PostgreSQL", "stores/sql/postgres", []string{"pgx"}},
	{"MySQL", "stores/sql/mysql", []string{"go-sql-driver"}},
	{"SQLite", "stores/sql/sqlite", []string{"modernc sqlite"}},
	{"MongoDB", "stores/mongo", []string{"mongo driver"}},
	{"remote", "stores/remote", nil},
}

// A program that opens one store: the store's package, the registry of
// package stores (stores.Open) and the middleware. It links that store's
// driver and no other store's, nor any broker client or test server (the
// list of TestLibrary_imports_no_broker_client).
func TestStore_program_links_only_its_driver(t *testing.T) {
	t.Parallel()
	g := graph(t)
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			roots := []string{module + "/" + s.pkg, module + "/stores", module + "/middleware"}
			linked := g.reach(t, roots...)
			own := map[string]bool{}
			for _, o := range s.own {
				own[o] = true
				if linked.find(g, storeDrivers[o]) == nil {
					t.Errorf("a program of %s does not link %s (%s): is the list of stores right?", s.pkg, o, storeDrivers[o])
				}
			}
			for _, name := range sortedKeys(storeDrivers) {
				if own[name] {
					continue
				}
				if chain := linked.find(g, storeDrivers[name]); chain != nil {
					t.Errorf("a program importing only %s (with stores and middleware) links %s: %s", s.pkg, name, strings.Join(chain, " -> "))
				}
			}
			for _, f := range forbidden {
				if chain := linked.find(g, f); chain != nil {
					t.Errorf("a program importing only %s (with stores and middleware) links %s: %s", s.pkg, f, strings.Join(chain, " -> "))
				}
			}
		})
	}
}

// A package made for one broker links that broker's client and not the
// other's: a Kafka program does not link amqp091, nor a RabbitMQ program
// sarama.
func TestBroker_package_links_only_its_client(t *testing.T) {
	t.Parallel()
	g := graph(t)
	clients := map[string][]string{
		"kafka": {"github.com/IBM/sarama", "github.com/ThreeDotsLabs/watermill-kafka"},
		"amqp":  {"github.com/rabbitmq/amqp091-go", "github.com/ThreeDotsLabs/watermill-amqp"},
	}
	for pkg, own := range clients {
		linked := g.reach(t, module+"/"+pkg, module+"/middleware")
		for _, o := range own {
			if linked.find(g, o) == nil {
				t.Errorf("package %s does not link %s: is the list of clients right?", pkg, o)
			}
		}
		for other, theirs := range clients {
			if other == pkg {
				continue
			}
			for _, c := range theirs {
				if chain := linked.find(g, c); chain != nil {
					t.Errorf("a program of package %s links %s: %s", pkg, c, strings.Join(chain, " -> "))
				}
			}
		}
	}
}

// Every package of the library links only the driver of the store it is
// part of (a package under stores/sql/postgres, pgx), and no store's driver
// otherwise (package stores, stores/sql, the middleware, the brokers'
// packages), except those that exist to link them all: stores/all, the
// commands, the examples, and the SQL tests' helper.
func TestLibrary_packages_link_no_other_store_driver(t *testing.T) {
	t.Parallel()
	g := graph(t)
	allowAll := []string{"stores/all", "cmd/", "examples/", "e2e", "internal/importcheck"}
	extra := map[string][]string{
		"stores/sql/internal/sqltest": {"pgx", "go-sql-driver", "modernc sqlite"},
	}
	var checked int
	for _, pkg := range g.ours {
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
		if hasPrefix(rel, allowAll...) {
			continue
		}
		checked++
		allowed := map[string]bool{}
		for _, s := range stores {
			if hasPrefix(rel, s.pkg) {
				for _, o := range s.own {
					allowed[o] = true
				}
			}
		}
		for p, names := range extra {
			if hasPrefix(rel, p) {
				for _, o := range names {
					allowed[o] = true
				}
			}
		}
		linked := g.reach(t, pkg)
		for _, name := range sortedKeys(storeDrivers) {
			if allowed[name] {
				continue
			}
			if chain := linked.find(g, storeDrivers[name]); chain != nil {
				t.Errorf("%s links %s: %s", pkg, name, strings.Join(chain, " -> "))
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked only %d packages: the listing is wrong", checked)
	}
}

// hasPrefix reports whether rel is one of prefixes, or lies under one
// (a prefix ending in "/" matches any path under it).
func hasPrefix(rel string, prefixes ...string) bool {
	for _, p := range prefixes {
		if rel == strings.TrimSuffix(p, "/") || strings.HasPrefix(rel, strings.TrimSuffix(p, "/")+"/") {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// depGraph is the import graph of the module's packages and their
// dependencies (not their tests'), from one go list.
type depGraph struct {
	imports map[string][]string // package -> its direct imports
	mod     map[string]string   // package -> its module path ("" for the standard library)
	ours    []string            // the module's packages
}

var (
	graphOnce sync.Once
	theGraph  depGraph
	graphErr  string
)

func graph(t *testing.T) depGraph {
	t.Helper()
	graphOnce.Do(func() {
		out, err := exec.Command("go", "list", "-deps", "-f",
			`{{.ImportPath}} {{if .Module}}{{.Module.Path}}{{else}}-{{end}} {{join .Imports ","}}`, module+"/...").Output()
		if err != nil {
			graphErr = "go list: " + err.Error()
			if ee, ok := err.(*exec.ExitError); ok {
				graphErr += "\n" + string(ee.Stderr)
			}
			return
		}
		g := depGraph{imports: map[string][]string{}, mod: map[string]string{}}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.SplitN(line, " ", 3)
			if len(f) < 2 {
				continue
			}
			pkg := f[0]
			if f[1] != "-" {
				g.mod[pkg] = f[1]
			}
			if len(f) == 3 && f[2] != "" {
				g.imports[pkg] = strings.Split(f[2], ",")
			}
			if g.mod[pkg] == module {
				g.ours = append(g.ours, pkg)
			}
		}
		theGraph = g
	})
	if graphErr != "" {
		t.Fatal(graphErr)
	}
	return theGraph
}

// reached holds the packages a program links, each with the package that
// first imported it (breadth first, so chains are shortest).
type reached map[string]string

// reach returns the packages that roots link.
func (g depGraph) reach(t *testing.T, roots ...string) reached {
	t.Helper()
	r := reached{}
	queue := []string{}
	for _, root := range roots {
		if _, ok := g.mod[root]; !ok {
			t.Fatalf("package %s is not in the module's listing", root)
		}
		r[root] = ""
		queue = append(queue, root)
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, imp := range g.imports[p] {
			if _, ok := r[imp]; !ok {
				r[imp] = p
				queue = append(queue, imp)
			}
		}
	}
	return r
}

// find returns the import chain from a root to the first linked package of
// a module starting with modPrefix, or nil.
func (r reached) find(g depGraph, modPrefix string) []string {
	var hits []string
	for p := range r {
		if strings.HasPrefix(g.mod[p], modPrefix) {
			hits = append(hits, p)
		}
	}
	if len(hits) == 0 {
		return nil
	}
	// The hit closest to a root gives the shortest chain.
	depth := func(p string) int {
		n := 0
		for ; r[p] != ""; p = r[p] {
			n++
		}
		return n
	}
	sort.Slice(hits, func(i, j int) bool {
		if di, dj := depth(hits[i]), depth(hits[j]); di != dj {
			return di < dj
		}
		return hits[i] < hits[j]
	})
	var chain []string
	for p := hits[0]; p != ""; p = r[p] {
		chain = append([]string{p}, chain...)
	}
	return chain
}
