package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// report is the JSON line a worker process prints every 50 ms and once
// more when it stopped (see cmd/internal/chaos/worker).
type report struct {
	Received     uint64 `json:"received"`
	Handled      uint64 `json:"handled"`
	Duplicates   uint64 `json:"duplicates"`
	Retried      uint64 `json:"retried"`
	DeadLettered uint64 `json:"dead_lettered"`
	Rebalances   int64  `json:"rebalances"`
	InFlight     int    `json:"in_flight"`
	Final        bool   `json:"final"`
}

// add adds o's counters to r.
func (r *report) add(o report) {
	r.Received += o.Received
	r.Handled += o.Handled
	r.Duplicates += o.Duplicates
	r.Retried += o.Retried
	r.DeadLettered += o.DeadLettered
	r.Rebalances += o.Rebalances
}

// proc is one life of a worker process.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // cmd.Wait's result, set before done is closed

	started time.Time

	mu      sync.Mutex
	last    report
	hasLast bool // a report was printed: the runner was created
	stderr  tail
}

// tail keeps the last 4 KiB written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if n := len(t.buf) - 4096; n > 0 {
		t.buf = append(t.buf[:0], t.buf[n:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// startProc starts the worker binary bin with args and env added to this
// process's environment.
func startProc(bin string, args, env []string) (*proc, error) {
	p := &proc{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = &p.stderr
	p.cmd.SysProcAttr = childAttr()
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var r report
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				p.mu.Lock()
				p.last, p.hasLast = r, true
				p.mu.Unlock()
			}
		}
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// pid is the process id.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// report is the last report the process printed.
func (p *proc) report() report {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// reported reports whether the process printed a report: its runner was
// created, so it got past connecting to its services.
func (p *proc) reported() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hasLast
}

// exited reports whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill SIGKILLs the process by its pid (no drain, no commit, no ack) and
// waits until it exited.
func (p *proc) kill() {
	if !p.exited() {
		_ = syscall.Kill(p.pid(), syscall.SIGKILL)
	}
	<-p.done
}

// killed reports whether the process ended by SIGKILL.
func (p *proc) killed() bool { return p.signaled(syscall.SIGKILL) }

// signaled reports whether the process ended by sig.
func (p *proc) signaled(sig syscall.Signal) bool {
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == sig {
			return true
		}
	}
	return false
}
