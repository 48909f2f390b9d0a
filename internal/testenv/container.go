package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// This file is the last resort of the resolution: the service in a Docker
// container, started by the program in testdata/containers (a module of its
// own, on testcontainers-go, so that idemq's module never depends on it),
// run with `go run . <service>`. The program publishes the service on a free
// loopback port, prints its address as NAME=value and then obeys stop,
// start and restart on its stdin; it lives until the test process ends
// (its stdin closes), then removes the container.

// containerStartTimeout bounds building the program, pulling the image and
// starting the service.
const containerStartTimeout = 5 * time.Minute

// container is a running testdata/containers program.
type container struct {
	mu     sync.Mutex // one command at a time
	stdin  io.WriteCloser
	stdout *bufio.Reader
	stderr *bytes.Buffer
	addr   string
}

var (
	containersMu sync.Mutex
	containers   = map[string]*container{}
)

// dockerPresent reports whether a Docker engine is configured on this
// machine: DOCKER_HOST is set or the default socket exists. Whether it
// answers, the program finds out.
func dockerPresent() error {
	if os.Getenv("DOCKER_HOST") != "" {
		return nil
	}
	for _, sock := range []string{"/var/run/docker.sock", filepath.Join(os.Getenv("XDG_RUNTIME_DIR"), "docker.sock")} {
		if _, err := os.Stat(sock); err == nil {
			return nil
		}
	}
	return errors.New("no Docker engine for a container (DOCKER_HOST unset, no docker.sock)")
}

// startContainer starts the service's container once per test process and
// returns its address.
func startContainer(t testing.TB, name string) (string, error) {
	t.Helper()
	containersMu.Lock()
	defer containersMu.Unlock()
	if c, ok := containers[name]; ok {
		return c.addr, nil
	}
	if name == RedisCluster || name == RedisSentinel || name == KafkaCluster {
		return "", fmt.Errorf("the %s profile has no container", name)
	}
	if err := dockerPresent(); err != nil {
		return "", err
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "run", ".", name)
	cmd.Dir = filepath.Join(root, "testdata", "containers")
	t.Logf("testenv: starting %s in a container (go run in %s)", name, cmd.Dir)
	c, err := launchContainer(cmd, services[name].envVar, containerStartTimeout)
	if err != nil {
		return "", fmt.Errorf("start %s container: %w", name, err)
	}
	containers[name] = c
	return c.addr, nil
}

// launchContainer starts cmd, a program that speaks the testdata/containers
// protocol, and waits up to timeout for its envVar=address line.
func launchContainer(cmd *exec.Cmd, envVar string, timeout time.Duration) (*container, error) {
	c := &container{stderr: &bytes.Buffer{}}
	cmd.Stderr = c.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c.stdin, c.stdout = stdin, bufio.NewReader(stdout)
	line, err := c.readLine(timeout)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("%w; its output: %s", err, strings.TrimSpace(c.stderr.String()))
	}
	v, ok := strings.CutPrefix(line, envVar+"=")
	if !ok || v == "" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("it printed %q, want %s=<address>", line, envVar)
	}
	c.addr = v
	return c, nil
}

// readLine reads one line of the program's output within timeout.
func (c *container) readLine(timeout time.Duration) (string, error) {
	type result struct {
		line string
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		line, err := c.stdout.ReadString('\n')
		ch <- result{strings.TrimSpace(line), err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return "", fmt.Errorf("read its answer: %w", r.err)
		}
		return r.line, nil
	case <-time.After(timeout):
		return "", fmt.Errorf("no answer within %s", timeout)
	}
}

// control sends command (stop, start or restart) and waits for the answer.
func (c *container) control(ctx context.Context, command string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := io.WriteString(c.stdin, command+"\n"); err != nil {
		return fmt.Errorf("send %s: %w", command, err)
	}
	timeout := containerStartTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	line, err := c.readLine(timeout)
	switch {
	case err != nil:
		return fmt.Errorf("%s: %w", command, err)
	case line != "ok":
		return fmt.Errorf("%s: %s", command, strings.TrimPrefix(line, "error: "))
	}
	return nil
}

// controlContainer stops, starts or restarts the service's container if this
// process started one; ok is false when it did not.
func controlContainer(ctx context.Context, command, service string) (ok bool, err error) {
	containersMu.Lock()
	c, found := containers[service]
	containersMu.Unlock()
	if !found {
		return false, nil
	}
	if err := c.control(ctx, command); err != nil {
		return true, fmt.Errorf("%s container: %w", service, err)
	}
	return true, nil
}

// moduleRoot returns the directory holding idemq's go.mod, found by walking
// up from the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find the module root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find the module root: no go.mod above the working directory")
		}
		dir = parent
	}
}
