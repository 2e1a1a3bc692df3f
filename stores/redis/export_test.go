package redisstore

// The scripts, for the benchmark that runs them through go-redis directly
// (the overhead of the store's Go side is measured against it).
var (
	TryBeginScript = tryBeginScript
	CompleteScript = completeScript
)
