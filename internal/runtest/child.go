package runtest

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Child is a process of this test binary started by StartChild: a helper
// test of the calling package (a relay, a consumer, a replay) that a crash
// test SIGKILLs.
type Child struct {
	cmd  *exec.Cmd
	out  *SyncBuffer
	done chan struct{}
	err  error // cmd.Wait's result, set before done is closed
	read int   // bytes of out that Expect has read past
}

// StartChild runs this test binary's test named test as a child process,
// with env added to this process's environment. The child is SIGKILLed at
// the end of the test if it still runs.
func StartChild(t testing.TB, test string, env []string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	c := &Child{cmd: cmd, out: &SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", test, err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() { c.Kill() })
	return c
}

// Pid is the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Done is closed when the child has exited.
func (c *Child) Done() <-chan struct{} { return c.done }

// Kill SIGKILLs the child (no drain, no commit, no ack) and waits for it
// to exit. It does nothing when the child has exited already.
func (c *Child) Kill() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Kill()
	<-c.done
}

// Killed reports whether the child has exited by SIGKILL.
func (c *Child) Killed() bool {
	select {
	case <-c.done:
	default:
		return false
	}
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return true
		}
	}
	return false
}

// Expect waits up to timeout for a line of the child's output (stdout and
// stderr) that starts with prefix, reading on after the line an earlier
// Expect returned, and returns it. It fails the test if the child exits or
// timeout passes first. Expect is for the test's goroutine only.
func (c *Child) Expect(t testing.TB, prefix string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		exited := false
		select {
		case <-c.done: // the output is complete once done is closed
			exited = true
		default:
		}
		if line, ok := c.nextLine(prefix); ok {
			return line
		}
		if exited {
			t.Fatalf("child %d exited (%v) before printing %q:\n%s", c.Pid(), c.err, prefix, c.Output())
		}
		select {
		case <-tick.C:
		case <-c.done:
		case <-deadline:
			t.Fatalf("child %d did not print %q within %s:\n%s", c.Pid(), prefix, timeout, c.Output())
		}
	}
}

// nextLine reads the complete lines after c.read up to the first that
// starts with prefix.
func (c *Child) nextLine(prefix string) (string, bool) {
	out := c.out.String()
	for {
		i := strings.IndexByte(out[c.read:], '\n')
		if i < 0 {
			return "", false
		}
		line := out[c.read : c.read+i]
		c.read += i + 1
		if strings.HasPrefix(line, prefix) {
			return line, true
		}
	}
}

// Output is what the child printed so far.
func (c *Child) Output() string { return c.out.String() }

// Err is how the child exited (nil when it has not, or exited with 0).
func (c *Child) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}
