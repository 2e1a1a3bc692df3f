package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// childEnv carries a child consumer's ConsumerSpec (JSON).
const childEnv = "INBOX_E2E_CHILD_SPEC"

// childLimit is how long a child consumer runs before it gives up: it is
// meant to be killed at its crash point long before.
const childLimit = 90 * time.Second

// childRoleEnv names the role (RegisterChild) a child process runs; without
// it the child runs a consumer.
const childRoleEnv = "INBOX_E2E_CHILD_ROLE"

// roleLimit is how long a child process of a role runs before it exits on
// its own, should the test that started it be gone.
const roleLimit = 4 * time.Minute

var childRoles = map[string]func(spec []byte) error{}

// RegisterChild makes [StartChildRole] with role run f in a child process
// (the test binary run again), with the spec as JSON. f runs until the
// process is killed (at a crash point it chose, or by the test); an error
// it returns ends the process with status 2. Call it from init, so that the
// child finds it before [Main] runs.
func RegisterChild(role string, f func(spec []byte) error) { childRoles[role] = f }

// Main is the TestMain of the suite's test packages, which exit with its
// result: os.Exit(harness.Main(m)). In a child process (re-executed by
// [StartChild]) it runs the consumer its spec describes until the spec's
// crash point kills it. Otherwise it runs the tests, with -test.parallel
// raised to 6 unless set: the cases mostly wait on brokers, stores and
// leases, not on the CPU.
func Main(m *testing.M) int {
	if raw := os.Getenv(childEnv); raw != "" {
		if role := os.Getenv(childRoleEnv); role != "" {
			return runRole(role, raw)
		}
		return runChild(raw)
	}
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "6")
	}
	defer removeInboxctl()
	return m.Run()
}

func runChild(raw string) int {
	var spec ConsumerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "e2e child: bad spec: %v\n", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	c, err := NewConsumer(ctx, spec, nil)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e child: %v\n", err)
		return 2
	}
	if err := c.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e child: %v\n", err)
		return 2
	}
	<-time.After(childLimit) // the crash point ends the process long before
	fmt.Fprintf(os.Stderr, "e2e child: crash point %s of %q not reached within %s\n", spec.CrashAt, spec.CrashID, childLimit)
	_ = c.Stop()
	return 3
}

func runRole(role, raw string) int {
	f, ok := childRoles[role]
	if !ok {
		fmt.Fprintf(os.Stderr, "e2e child: no role %q registered\n", role)
		return 2
	}
	done := make(chan error, 1)
	go func() { done <- f([]byte(raw)) }()
	select {
	case err := <-done:
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e child %s: %v\n", role, err)
			return 2
		}
		return 0
	case <-time.After(roleLimit):
		fmt.Fprintf(os.Stderr, "e2e child %s: still running after %s; exiting\n", role, roleLimit)
		return 3
	}
}

// Child is a consumer running in a child process (the test binary run
// again).
type Child struct {
	cmd    *exec.Cmd
	output *lockedBuffer
	exited chan struct{}
	err    error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// StartChild runs a consumer for spec in a new process. It is killed when
// the test ends, if still running.
func StartChild(t testing.TB, spec ConsumerSpec) *Child {
	t.Helper()
	return startProcess(t, "", spec)
}

// StartChildRole runs role ([RegisterChild]) in a new process, with spec
// as JSON. It is killed when the test ends, if still running.
func StartChildRole(t testing.TB, role string, spec any) *Child {
	t.Helper()
	if _, ok := childRoles[role]; !ok {
		t.Fatalf("no child role %q registered", role)
	}
	return startProcess(t, role, spec)
}

func startProcess(t testing.TB, role string, spec any) *Child {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out := &lockedBuffer{}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	if role != "" {
		cmd.Env = append(cmd.Env, childRoleEnv+"="+role)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the child consumer: %v", err)
	}
	c := &Child{cmd: cmd, output: out, exited: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = cmd.Process.Kill()
			<-c.exited
		}
	})
	return c
}

// Output is what the child printed so far.
func (c *Child) Output() string { return c.output.String() }

// Exited reports whether the child has ended.
func (c *Child) Exited() bool {
	select {
	case <-c.exited:
		return true
	default:
		return false
	}
}

// WaitKilled waits for the child to die of the SIGKILL it sends itself at
// its crash point, and fails the test if it exits any other way.
func (c *Child) WaitKilled(t testing.TB, timeout time.Duration) {
	t.Helper()
	select {
	case <-c.exited:
	case <-time.After(timeout):
		t.Fatalf("the child consumer did not reach its crash point within %s; its output:\n%s", timeout, c.output.String())
	}
	if out := c.output.String(); strings.Contains(out, "WARNING: DATA RACE") {
		t.Errorf("the child consumer found a data race:\n%s", out)
	}
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the child consumer ended with %v, not SIGKILL at its crash point; its output:\n%s", c.err, c.output.String())
	}
}

// Pid is the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Kill kills the child with SIGKILL and waits for it to end; it fails the
// test if the child had ended before, or found a data race.
func (c *Child) Kill(t testing.TB) {
	t.Helper()
	if c.Exited() {
		t.Fatalf("the child consumer ended before it was killed (%v); its output:\n%s", c.err, c.output.String())
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("killing the child consumer: %v", err)
	}
	c.WaitKilled(t, 30*time.Second)
}

// CheckRunning fails the test if the child has ended or found a data race.
func (c *Child) CheckRunning(t testing.TB) {
	t.Helper()
	if out := c.output.String(); strings.Contains(out, "WARNING: DATA RACE") {
		t.Errorf("the child consumer found a data race:\n%s", out)
	}
	if c.Exited() {
		t.Errorf("the child consumer ended (%v); its output:\n%s", c.err, c.output.String())
	}
}
