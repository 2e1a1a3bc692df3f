// Package faultproxy is a loopback TCP proxy for outage tests: put it between
// a client and a server, then cut, stall, slow down or restore the link.
// Tests never stop the shared servers; they break the path to them instead.
package faultproxy

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Mode is how the proxy treats connections.
type Mode int

const (
	// Pass forwards bytes both ways.
	Pass Mode = iota
	// Refuse closes every new connection at once (the client sees a reset or
	// EOF) and has closed the existing ones.
	Refuse
	// Stall accepts connections and forwards nothing: the client waits until
	// its own timeout. Existing connections are closed when entering Stall.
	Stall
)

// Proxy forwards a loopback port to a target address.
type Proxy struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // time.Duration each forwarded chunk is held
	// replyDelay is the time.Duration each chunk from the target is held
	// on top of delay.
	replyDelay atomic.Int64

	mu      sync.Mutex
	mode    Mode
	conns   map[net.Conn]struct{}
	stalled map[net.Conn]struct{} // accepted while stalled: never forwarded
	wg      sync.WaitGroup
	done    chan struct{}
}

// New starts a proxy to target ("host:port") on a free loopback port and stops
// it when the test ends.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// Start starts a proxy to target ("host:port") on a free loopback port,
// outside a test (the benchmark harness's store latency); the caller
// closes it.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, conns: make(map[net.Conn]struct{}), stalled: make(map[net.Conn]struct{}), done: make(chan struct{})}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the proxy's "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetMode switches the proxy. Entering Refuse or Stall closes the open
// connections, so clients notice at once; leaving Stall closes the
// connections accepted while stalled (they were never forwarded), so clients
// reconnect instead of waiting for their own timeouts.
func (p *Proxy) SetMode(m Mode) {
	p.mu.Lock()
	p.mode = m
	var toClose []net.Conn
	if m != Pass {
		for c := range p.conns {
			toClose = append(toClose, c)
		}
	}
	if m != Stall {
		for c := range p.stalled {
			toClose = append(toClose, c)
			delete(p.stalled, c)
		}
	}
	p.mu.Unlock()
	for _, c := range toClose {
		_ = c.Close()
	}
}

// Stalled returns how many connections the proxy holds unanswered in Stall.
func (p *Proxy) Stalled() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.stalled)
}

// Cut is SetMode(Refuse); Stall is SetMode(Stall); Restore is SetMode(Pass)
// and Delay(0): the link as it was before any fault.
func (p *Proxy) Cut()   { p.SetMode(Refuse) }
func (p *Proxy) Stall() { p.SetMode(Stall) }
func (p *Proxy) Restore() {
	p.Delay(0)
	p.DelayReplies(0)
	p.SetMode(Pass)
}

// Delay makes the proxy hold every chunk of bytes it reads, in both
// directions, for d before it passes it on: latency, not a bandwidth limit,
// so a request and its reply take at least 2*d longer and pipelined bytes
// still flow together. Each chunk is due d after it was read, whatever the
// chunks before it: a reply read in several chunks is late by d, not by d
// per chunk. It applies to the bytes read from then on, on open and new
// connections, in Pass mode; bytes keep their order. Zero or negative
// forwards at once again. On Linux, waits under 10 ms are precise to some
// microseconds (a timerfd); elsewhere, and for longer ones, to about a
// millisecond (the runtime's timers).
func (p *Proxy) Delay(d time.Duration) { p.delay.Store(int64(max(d, 0))) }

// DelayReplies makes the proxy hold the bytes it reads from the target for
// d (on top of Delay's) and pass the client's at once: a request and its
// reply take d longer, as across a network d away, with half the waits of
// Delay(d/2), so half the wake-ups of the proxy's goroutines (which cost
// CPU time, in a benchmark on the same cores). Zero or negative removes
// it; Restore too.
func (p *Proxy) DelayReplies(d time.Duration) { p.replyDelay.Store(int64(max(d, 0))) }

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	select {
	case <-p.done:
		return
	default:
	}
	close(p.done)
	_ = p.ln.Close()
	p.SetMode(Refuse)
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return false
	default:
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		mode := p.mode
		p.mu.Unlock()
		switch mode {
		case Refuse:
			_ = c.Close()
			continue
		case Stall:
			p.mu.Lock()
			if p.mode == Stall {
				p.stalled[c] = struct{}{}
				c = nil
			}
			p.mu.Unlock()
			if c != nil {
				_ = c.Close() // the mode changed meanwhile: let the client reconnect
			}
			continue // held open until the mode changes or the proxy closes
		}
		if !p.track(c) {
			_ = c.Close()
			return
		}
		p.wg.Add(1)
		go p.forward(c)
	}
}

func (p *Proxy) forward(c net.Conn) {
	defer p.wg.Done()
	defer p.untrack(c)
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(s) {
		_ = s.Close()
		return
	}
	defer p.untrack(s)
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn, hold func() time.Duration) {
		defer wg.Done()
		p.copy(dst, src, hold)
		_ = dst.Close()
		_ = src.Close()
	}
	go pipe(s, c, func() time.Duration { return time.Duration(p.delay.Load()) })
	go pipe(c, s, func() time.Duration { return time.Duration(p.delay.Load() + p.replyDelay.Load()) })
	wg.Wait()
}

// preciseWait bounds the waits of a chunk's delay made on a waiter
// (wait_linux.go: precise to microseconds, but not interrupted by Close);
// longer ones use a runtime timer, precise to about a millisecond, which
// Close interrupts.
const preciseWait = 10 * time.Millisecond

// chunk is what one read from a connection got, and when it may go on.
type chunk struct {
	b   []byte
	due time.Time
}

// copy forwards src to dst until either fails, holding each chunk for what
// hold said when it was read. A reading goroutine stamps the chunks and
// this one writes them when due; a chunk held for nothing, with none
// waiting before it, is written by the reading goroutine at once (waking
// no other goroutine, which costs CPU time on the cores the proxy shares).
func (p *Proxy) copy(dst, src net.Conn, hold func() time.Duration) {
	ch := make(chan chunk, 64)
	var queued atomic.Int64 // chunks sent on ch and not yet written
	go func() {
		defer close(ch)
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if d := hold(); d <= 0 && queued.Load() == 0 {
					if _, err := dst.Write(buf[:n]); err != nil {
						_ = src.Close()
						return
					}
				} else {
					queued.Add(1)
					ch <- chunk{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(d)}
				}
			}
			if err != nil {
				return
			}
		}
	}()
	failed := false
	var w *waiter // made at the first short wait; nil without a timerfd
	made := false
	defer func() { w.close() }()
	for c := range ch {
		if failed {
			continue // drain, so that the reader ends once src is closed
		}
		if wait := time.Until(c.due); wait > 0 && wait < preciseWait {
			if !made {
				w, made = newWaiter(), true
			}
			w.wait(wait)
		}
		if wait := time.Until(c.due); wait > 0 { // a long wait, or no waiter
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-p.done:
				t.Stop()
			}
		}
		if _, err := dst.Write(c.b); err != nil {
			failed = true
			_ = src.Close()
		}
		queued.Add(-1)
	}
}
