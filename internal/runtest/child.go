package runtest

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// Child is a process of this test binary started by StartChild: a helper
// test of the calling package (a relay, a consumer, a replay) that a crash
// test SIGKILLs.
type Child struct {
	cmd  *exec.Cmd
	out  *SyncBuffer
	done chan struct{}
	err  error // cmd.Wait's result, set before done is closed
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
