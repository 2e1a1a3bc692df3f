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

// TestBackoff_failing_twice_then_succeeding runs on Redis and PostgreSQL:
// it takes 16 consumers (RabbitMQ) or partitions (Kafka) and 11 to 16 s a
// cell.
func TestBackoff_failing_twice_then_succeeding(t *testing.T) {
	harness.Run(t, only(storeKinds(), "redis", "postgres"), harness.Backoff)
}

// TestMisconfiguredStore_costs_a_few_calls_a_second: stores opened with
// check=false and wrong in a way only a call finds: a missing PostgreSQL
// table, a wrong Redis password, a remote service without its token.
func TestMisconfiguredStore_costs_a_few_calls_a_second(t *testing.T) {
	harness.Run(t, misconfiguredKinds(), harness.Misconfigured)
}
