# watermill-inbox developer targets. Every module of the repository (the
# library and the small modules under examples/, e2e/ and stores/ that carry
# heavy or clashing dependencies) is tested by `make test`.

GO          ?= go
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
DEADCODE    ?= $(GO) run golang.org/x/tools/cmd/deadcode@v0.52.0
BENCHSTAT   ?= $(GO) run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
MODULES     := $(shell find . -name go.mod -not -path './.git/*' -exec dirname {} \; | sort)
# The race detector needs cgo (a C compiler). Without one, tests run without
# -race and say so; CI has one and checks it.
RACE        := $(shell [ "$$($(GO) env CGO_ENABLED 2>/dev/null)" = 1 ] && echo -race)
TEST_FLAGS  ?= $(RACE) -count=1 -timeout 25m
FUZZTIME    ?= 20s
BENCH       ?= .
BENCHCOUNT  ?= 6

.PHONY: test lint fmt vet staticcheck deadcode fuzz cover bench bench-go bench-instr e2e tidy

## test: all tests of all modules, with -race. Tests whose service is down
## skip, and one line at the end names them; INBOX_REQUIRE_SERVICES=1 makes a
## missing service a failure. The figures tests measure for a reader
## (testenv.Report) are printed at the end too.
# run_tests runs go test in each module of $(1), then prints one line naming
# the tests that skipped and how to enable them (a missing service, or a
# capability the server at hand lacks).
define run_tests
	@[ -n "$(RACE)" ] || echo "note: no C compiler (cgo is off), so tests run without -race; install gcc for the race detector"
	@skipfile=$$(mktemp); reportfile=$$(mktemp); rc=0; \
	for m in $(1); do \
		echo "== go test $$m"; \
		(cd $$m && INBOX_SKIP_FILE=$$skipfile INBOX_REPORT_FILE=$$reportfile $(GO) test $(TEST_FLAGS) ./...) || rc=1; \
	done; \
	if [ -s $$reportfile ]; then echo "reported by tests:"; sort $$reportfile | sed 's/^/  /'; fi; \
	rm -f $$reportfile; \
	if [ -s $$skipfile ]; then \
		echo "skipped (service missing or capability absent): $$(sort -u $$skipfile | paste -sd ';' - | sed 's/;/; /g')"; \
	fi; \
	rm -f $$skipfile; exit $$rc
endef

test:
	$(call run_tests,$(MODULES))

## e2e: the end-to-end suite only (the modules under e2e/: brokers, stores,
## crashes, outages), with -race. Needs the services of `make test`; Kafka
## runs in-process (kfake), plus a real broker when KAFKA_BROKERS is set.
E2E_MODULES := $(filter ./e2e ./e2e/%,$(MODULES))
e2e:
	$(call run_tests,$(E2E_MODULES))

## lint: gofmt, go vet and staticcheck on every module, deadcode on the
## library's module.
lint: fmt vet staticcheck deadcode

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	@for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done

staticcheck:
	@for m in $(MODULES); do (cd $$m && $(STATICCHECK) ./...) || exit 1; done

# deadcode: the functions of the library's module (its packages and the
# commands inboxctl and inboxd) that neither a command nor a test reaches.
# staticcheck's unused check (U1000) already finds unused unexported
# identifiers; this finds exported functions and methods that nothing calls,
# in internal packages too. Lines in _test.go files are left out: examples
# without an Output comment compile but do not run, so no test reaches them.
deadcode:
	@out=$$($(DEADCODE) -test ./...) || exit 1; \
	out=$$(printf '%s\n' "$$out" | grep -v '_test\.go:'); \
	if [ -n "$$out" ]; then echo "dead code (no command or test reaches it):"; echo "$$out"; exit 1; fi

## fuzz: run every fuzz target of the library for FUZZTIME each.
fuzz:
	@for pkg in $$($(GO) list ./...); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
			echo "== $$pkg $$f"; \
			$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
		done; \
	done

## cover: coverage of the library's packages, as coverage.out and coverage.html.
cover:
	$(GO) test -count=1 -coverpkg=./... -coverprofile=coverage.out ./...
	$(GO) tool cover -func=coverage.out | tail -1
	$(GO) tool cover -html=coverage.out -o coverage.html

## bench: the one-run benchmark harness (cmd/inboxbench, see BENCHMARKS.md):
## router throughput on RabbitMQ and Kafka per store, scaling with 1, 4 and 16
## consumers, batch sizes of the stores that batch, with the stores on
## loopback and 250 µs away (-store-rtt), the middleware's cost per
## message, store round trips against the raw clients, and failed
## attempts held by the broker (issue 21's failures section), and sizing
## (issue 46: bytes per kept key against each store's floor, PostgreSQL's
## WAL per message, claims on a store holding 5 million bulk-loaded keys,
## with and without its janitor; Redis in a redis-server of its own and
## the prefilled MariaDB in a mariadbd of its own, so redis-server,
## mariadbd and mariadb-install-db must be on PATH, and MongoDB on FerretDB, built in
## cmd/inboxbench/mongosizing). Interleaved
## repetitions, medians, ratios within each repetition. Writes
## docs/bench-results.md, docs/throughput.svg and the targets section of
## BENCHMARKS.md (between its inboxbench:targets markers). Needs the services
## of the tests (RabbitMQ, Redis, PostgreSQL, MariaDB); Kafka runs in process
## (kfake). The last full run took 50 minutes on two quiet cores, 12 of them
## the sizing section (most of it the bulk loads of 5 million keys and the
## trials of the full stores);
## BENCH_FLAGS passes more flags
## (go run ./cmd/inboxbench -h in that directory lists them); the order
## section (issue 45, order per key on Kafka) runs only when named:
## BENCH_FLAGS='-sections order'.
bench:
	cd cmd/inboxbench && $(GO) run . -md ../../docs/bench-results.md -svg ../../docs/throughput.svg -benchmarks-md ../../BENCHMARKS.md $(BENCH_FLAGS)

## bench-go: every Go benchmark of the library, BENCHCOUNT runs each,
## summarised by benchstat.
bench-go:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -count $(BENCHCOUNT) ./... | tee bench.txt
	$(BENCHSTAT) bench.txt

## bench-instr: instructions per message of BenchmarkMiddleware (none and
## inbox-memory), counted by callgrind: the growth from 20,000 to 60,000
## messages over 40,000, with GOMAXPROCS=1, so independent of the machine's
## load; once with the collector and once without (GOGC=off). Needs valgrind.
bench-instr:
	@bin=$$(mktemp); out=$$(mktemp); \
	$(GO) test -c -o $$bin ./middleware/ || exit 1; \
	count() { GOGC=$$1 GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --callgrind-out-file=$$out \
		$$bin -test.run '^$$' -test.bench "^BenchmarkMiddleware/$$2$$" -test.benchtime $${3}x >/dev/null 2>&1 || exit 1; \
		grep -E '^(summary|totals):' $$out | head -1 | awk '{print $$2}'; }; \
	for gc in 100 off; do for b in none inbox-memory; do \
		a=$$(count $$gc $$b 20000); z=$$(count $$gc $$b 60000); \
		echo "GOGC=$$gc $$b: $$(( (z - a) / 40000 )) instructions per message"; \
	done; done; rm -f $$bin $$out

tidy:
	@for m in $(MODULES); do (cd $$m && $(GO) mod tidy) || exit 1; done
