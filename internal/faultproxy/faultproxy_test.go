package faultproxy_test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox/internal/faultproxy"
)

func echoServer(t *testing.T) string {
	return lineServer(t, func(c net.Conn, line string) error {
		_, err := c.Write([]byte(line))
		return err
	})
}

// lineServer serves each connection line by line: answer writes the reply
// to each line, and an error of its closes the connection.
func lineServer(t *testing.T, answer func(c net.Conn, line string) error) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if answer(c, line) != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err = bufio.NewReader(c).ReadString('\n')
	return err
}

func TestProxy_cut_stall_restore(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echoServer(t))
	if err := roundTrip(p.Addr()); err != nil {
		t.Fatalf("pass: %v", err)
	}
	p.Cut()
	if err := roundTrip(p.Addr()); err == nil {
		t.Fatal("cut: round trip succeeded")
	}
	p.Stall()
	if err := roundTrip(p.Addr()); err == nil {
		t.Fatal("stall: round trip succeeded")
	}
	p.Restore()
	if err := roundTrip(p.Addr()); err != nil {
		t.Fatalf("restored: %v", err)
	}
}

// A connection accepted while stalled is closed on Restore, so the client
// notices at once instead of waiting for its own timeout.
func TestProxy_restore_closes_stalled_connections(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echoServer(t))
	p.Stall()
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); p.Stalled() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the proxy never accepted the connection")
		}
		time.Sleep(time.Millisecond) // polling interval
	}
	p.Restore()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	_, err = bufio.NewReader(c).ReadString('\n')
	if err == nil {
		t.Fatal("a stalled connection was answered after Restore; want it closed")
	}
	if time.Since(start) > 4*time.Second {
		t.Fatalf("the stalled connection was not closed on Restore (read waited %s)", time.Since(start))
	}
	if err := roundTrip(p.Addr()); err != nil {
		t.Fatalf("new connection after Restore: %v", err)
	}
}

// Delay holds bytes both ways: a round trip takes at least twice the delay,
// pipelined requests share it (latency, not a rate), and Restore removes it.
func TestProxy_delay(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echoServer(t))
	const d = 150 * time.Millisecond
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	echo := func(lines int) time.Duration {
		t.Helper()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		start := time.Now()
		for range lines {
			if _, err := c.Write([]byte("ping\n")); err != nil {
				t.Fatal(err)
			}
		}
		for range lines {
			if _, err := r.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
		return time.Since(start)
	}
	echo(1) // the connection to the server is up
	p.Delay(d)
	if e := echo(1); e < 2*d {
		t.Fatalf("a round trip with a %s delay took %s, want at least %s", d, e, 2*d)
	}
	// Ten pipelined lines arrive together: far less than ten round trips.
	if e := echo(10); e < 2*d || e > 8*d {
		t.Fatalf("ten pipelined lines with a %s delay took %s, want about %s", d, e, 2*d)
	}
	p.Restore()
	if e := echo(1); e >= d {
		t.Fatalf("a round trip after Restore took %s, want well under the %s delay", e, d)
	}
}

// chunkServer answers each line with "x" parts-1 times, then the line,
// each piece written gap after the previous one: a reply that the proxy
// reads in several chunks.
func chunkServer(t *testing.T, parts int, gap time.Duration) string {
	return lineServer(t, func(c net.Conn, line string) error {
		for i := range parts {
			piece := "x"
			if i == parts-1 {
				piece = line
			}
			if _, err := c.Write([]byte(piece)); err != nil {
				return err
			}
			if i < parts-1 {
				time.Sleep(gap) // the shape of the reply, not a synchronisation
			}
		}
		return nil
	})
}

// timedEcho sends lines "ping" lines on c and reads their replies (up to
// each line's end), and returns how long that took.
func timedEcho(t *testing.T, c net.Conn, r *bufio.Reader, lines int) time.Duration {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	for range lines {
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
	}
	for range lines {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	return time.Since(start)
}

// DelayReplies holds the target's bytes only: a round trip takes d longer,
// not 2d; pipelined requests share it; a reply the proxy reads in several
// chunks is late by d once, not by d per chunk; Restore removes it.
func TestProxy_delay_replies(t *testing.T) {
	t.Parallel()
	const d, parts, gap = 150 * time.Millisecond, 5, 20 * time.Millisecond
	for _, tc := range []struct {
		name   string
		server string
		least  time.Duration // the round trip's least duration without the proxy
	}{
		{"one chunk", echoServer(t), 0},
		{"five chunks", chunkServer(t, parts, gap), (parts - 1) * gap},
	} {
		p := faultproxy.New(t, tc.server)
		c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		r := bufio.NewReader(c)
		timedEcho(t, c, r, 1) // the connection to the server is up
		p.DelayReplies(d)
		// One d on top of the reply's own time; d per chunk would be parts*d.
		if e := timedEcho(t, c, r, 1); e < d+tc.least || e >= 2*d+tc.least {
			t.Fatalf("%s: a round trip with replies held %s took %s, want at least %s and under %s", tc.name, d, e, d+tc.least, 2*d+tc.least)
		}
		if e := timedEcho(t, c, r, 10); e < d || e > 5*d+10*tc.least {
			t.Fatalf("%s: ten pipelined lines with replies held %s took %s, want about %s", tc.name, d, e, d+10*tc.least)
		}
		p.Restore()
		if e := timedEcho(t, c, r, 1); e >= d+tc.least {
			t.Fatalf("%s: a round trip after Restore took %s, want well under the %s delay", tc.name, e, d)
		}
	}
}

// Delays below the proxy's precise bound (10 ms) are waited on a timerfd
// on Linux: never shorter than asked.
func TestProxy_short_delays(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echoServer(t))
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	timedEcho(t, c, r, 1)
	const d = 2 * time.Millisecond
	p.DelayReplies(d)
	for range 20 {
		if e := timedEcho(t, c, r, 1); e < d {
			t.Fatalf("a round trip with replies held %s took %s", d, e)
		}
	}
	p.DelayReplies(0)
	p.Delay(d)
	for range 20 {
		if e := timedEcho(t, c, r, 1); e < 2*d {
			t.Fatalf("a round trip with a %s delay took %s, want at least %s", d, e, 2*d)
		}
	}
}
