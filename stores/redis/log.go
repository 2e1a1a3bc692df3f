package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
)

// goRedisLog is the logger go-redis's lines go to; nil discards them.
var goRedisLog atomic.Pointer[watermill.LoggerAdapter]

// go-redis has one logger for the whole process (redis.SetLogger), which by
// default prints to standard error. It is a plain variable that go-redis's
// goroutines read without synchronisation, so it is set here, once, while
// the program initialises and before any client exists; what it forwards to
// changes atomically through SetLogger.
func init() {
	redis.SetLogger(goRedisLogger{})
}

// SetLogger sends the lines go-redis logs (a dial that failed after its
// retries, a connection closed with unread data, a Cluster node marked
// failing, ...) to l, at debug level, with the field source=go-redis; nil
// discards them, which is the default.
//
// go-redis has one logger per process, not per client: importing this
// package replaces go-redis's default, which prints to standard error
// outside any logger of the application, with one that forwards to the
// logger given here, for every go-redis client of the process, the
// application's own included. A later call of redis.SetLogger by the
// application replaces it.
//
// Debug level, because every fault these lines describe also reaches the
// caller of the store as an error (wrapping inbox.ErrStoreUnavailable), which
// the inbox middleware logs once and then counts; at a higher level an
// outage would print a line per failed dial, the flood the middleware's
// logging avoids.
//
// The store's own warnings (a server that hides its maxmemory-policy from
// the check at Open) go to l too, at info level with the field
// level=warning; without l, to log/slog's default logger.
//
// SetLogger is safe to call at any time, from any goroutine.
func SetLogger(l watermill.LoggerAdapter) {
	if l == nil {
		goRedisLog.Store(nil)
		return
	}
	goRedisLog.Store(&l)
}

// goRedisLogger implements go-redis's logging interface.
type goRedisLogger struct{}

func (goRedisLogger) Printf(_ context.Context, format string, v ...any) {
	l := goRedisLog.Load()
	if l == nil {
		return
	}
	msg := strings.TrimSpace(fmt.Sprintf(format, v...))
	msg = strings.TrimPrefix(msg, "redis: ")
	(*l).Debug("go-redis: "+msg, watermill.LogFields{"source": "go-redis"})
}

// warn logs what the store itself warns about (at Open): at info level,
// with the field level=warning, through the logger given to SetLogger, or,
// when none was given, as a warning through log/slog's default logger, so
// that it is not lost.
func warn(msg string, fields watermill.LogFields) {
	if l := goRedisLog.Load(); l != nil {
		(*l).Info(msg, fields.Add(watermill.LogFields{"level": "warning"}))
		return
	}
	args := make([]any, 0, 2*len(fields))
	for k, v := range fields {
		args = append(args, k, v)
	}
	slog.Warn(msg, args...)
}
