//go:build linux

package faultproxy

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// A waiter sleeps for short spans precisely. The runtime's timers are not
// precise below a millisecond: when every goroutine is idle, the runtime
// sleeps in epoll_wait, whose timeout is in whole milliseconds, so a timer
// of 125 µs fires after about 1.1 ms (a round trip through a proxy with a
// 125 µs delay took 2.4 ms). A waiter arms a timerfd, which the kernel
// fires without timer slack, and reads it through the runtime's poller: the
// goroutine parks, no thread is held, and it wakes when the timer fires.
type waiter struct {
	fd int
	f  *os.File // fd, registered with the runtime's poller
}

// newWaiter returns a waiter, or nil when the system refuses a timerfd (the
// caller then uses a runtime timer).
func newWaiter() *waiter {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil
	}
	// A non-blocking descriptor: os.NewFile makes its reads park the
	// goroutine in the poller.
	return &waiter{fd: fd, f: os.NewFile(uintptr(fd), "faultproxy-timerfd")}
}

// wait sleeps for d (positive) and tells whether it did; false means the
// timerfd failed, or w is nil, and the caller must wait by other means.
func (w *waiter) wait(d time.Duration) bool {
	if w == nil {
		return false
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(d.Nanoseconds())}
	if err := unix.TimerfdSettime(w.fd, 0, &spec, nil); err != nil {
		return false
	}
	var expirations [8]byte
	_, err := w.f.Read(expirations[:])
	return err == nil
}

// close releases the timerfd; nil-safe.
func (w *waiter) close() {
	if w != nil {
		_ = w.f.Close()
	}
}
