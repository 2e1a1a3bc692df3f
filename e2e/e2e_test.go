package e2e_test

import (
	"io"
	"log"
	"os"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-inbox/inbox/e2e/internal/harness"
)

func TestMain(m *testing.M) {
	harness.RegisterMode("tx", txMode)
	// The outage cases break MariaDB connections on purpose; the driver
	// would log each broken one.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	os.Exit(harness.Main(m))
}

func TestDuplicates_each_effect_once(t *testing.T) {
	harness.Run(t, storeKinds(), harness.Duplicates)
}

func TestCompetingConsumers_with_failures_exactly_once(t *testing.T) {
	harness.Run(t, storeKinds(), harness.Competing)
}

func TestCrash_before_effect_applied_once_after_lease(t *testing.T) {
	harness.Run(t, storeKinds(), harness.Crash(harness.CrashBeforeEffect))
}

func TestCrash_after_effect_before_mark(t *testing.T) {
	harness.Run(t, storeKinds(), harness.Crash(harness.CrashAfterEffect))
}

func TestStoreOutage_nacked_then_processed_once(t *testing.T) {
	harness.Run(t, storeKinds(), harness.Outage)
}

func TestBadInput_handled_per_policy(t *testing.T) {
	harness.Run(t, storeKinds(), harness.BadInput)
}

// TestPoison_dead_after_max_attempts_then_replayed fails until the
// middleware stops handing a failed attempt before the last one to a poison
// queue filtered with !inboxmw.IsTransient (the handler's error is returned
// unchanged, and IsTransient reports it permanent): the message is poisoned
// and acked after one run instead of three.
func TestPoison_dead_after_max_attempts_then_replayed(t *testing.T) {
	harness.Run(t, storeKinds(), harness.Poison)
}

// TestBackoff_failing_twice_then_succeeding runs on Redis and PostgreSQL:
// it takes 16 consumers (RabbitMQ) or partitions (Kafka) and 11 to 16 s a
// cell; the poison scenario covers the failed attempts of the other stores.
func TestBackoff_failing_twice_then_succeeding(t *testing.T) {
	harness.Run(t, only(storeKinds(), "redis", "postgres"), harness.Backoff)
}

// TestMisconfiguredStore_costs_a_few_calls_a_second: stores opened with
// check=false and wrong in a way only a call finds: a missing PostgreSQL
// table, a wrong Redis password, a remote service without its token.
func TestMisconfiguredStore_costs_a_few_calls_a_second(t *testing.T) {
	harness.Run(t, misconfiguredKinds(), harness.Misconfigured)
}

// TestRedelivery_crash_at_the_hand_off: a failed attempt handed to the
// broker (RabbitMQ delay queues, Kafka retry topics), the consumer killed
// with SIGKILL before the copy and after it (before the original's ack).
func TestRedelivery_crash_at_the_hand_off(t *testing.T) {
	kinds := only(storeKinds(), "redis", "postgres", "postgres-tx")
	t.Run("before-copy", func(t *testing.T) { harness.Run(t, kinds, harness.RedeliveryCrash(harness.CrashBeforeCopy)) })
	t.Run("after-copy", func(t *testing.T) { harness.Run(t, kinds, harness.RedeliveryCrash(harness.CrashAfterCopy)) })
}

// TestRedelivery_throughput_with_failures logs the line "throughput with
// failures ÷ without: X" for each broker.
func TestRedelivery_throughput_with_failures(t *testing.T) {
	harness.Run(t, only(storeKinds(), "redis", "postgres"), harness.RedeliveryThroughput)
}

// TestOrder_kill_and_store_freeze_keep_each_keys_order is issue 45's
// acceptance scenario (k), on Redis and PostgreSQL: each account's events
// applied in order with Config.OrderKey and Redelivery, through failed
// first attempts, a 3 s store freeze and a consumer killed half-way (on
// RabbitMQ a single active consumer queue). harness.Order(false), the same
// run without an order key, finds order violations.
func TestOrder_kill_and_store_freeze_keep_each_keys_order(t *testing.T) {
	harness.Run(t, only(storeKinds(), "redis", "postgres"), harness.Order(true))
}
