//go:build !linux

package faultproxy

import "time"

// waiter is Linux's timerfd (wait_linux.go); elsewhere the proxy waits on
// the runtime's timers, precise to about a millisecond.
type waiter struct{}

func newWaiter() *waiter { return nil }

func (*waiter) wait(time.Duration) bool { return false }

func (*waiter) close() {}
