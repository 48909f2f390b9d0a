package testenv

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestHelperContainer is not a test: the protocol tests run it as a stand-in
// for the testdata/containers program.
func TestHelperContainer(t *testing.T) {
	if os.Getenv("IDEMQ_TEST_FAKE_CONTAINER") == "" {
		t.Skip("stand-in for the testdata/containers program, run by TestContainerProtocol")
	}
	fmt.Println("TEST_REDIS_URL=redis://127.0.0.1:16379/0")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "stop", "start", "restart":
			fmt.Println("ok")
		default:
			fmt.Printf("error: unknown command %q\n", in.Text())
		}
	}
	os.Exit(0)
}

func fakeContainer() *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperContainer$")
	cmd.Env = append(os.Environ(), "IDEMQ_TEST_FAKE_CONTAINER=1")
	return cmd
}

// launchContainer reads the program's address line and relays stop, start
// and restart with their answers; the program ends when its stdin closes.
func TestContainerProtocol(t *testing.T) {
	cmd := fakeContainer()
	c, err := launchContainer(cmd, "TEST_REDIS_URL", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if c.addr != "redis://127.0.0.1:16379/0" {
		t.Errorf("address %q", c.addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, command := range []string{"stop", "start", "restart"} {
		if err := c.control(ctx, command); err != nil {
			t.Errorf("%s: %v", command, err)
		}
	}
	if err := c.control(ctx, "explode"); err == nil || !strings.Contains(err.Error(), `unknown command "explode"`) {
		t.Errorf("unknown command: err %v, want the program's error", err)
	}
	_ = c.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("program exited with %v after its stdin closed", err)
		}
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		t.Fatal("program still running after its stdin closed")
	}
}

// An address line for another service, or none at all, is an error that
// shows what the program printed.
func TestContainerProtocolErrors(t *testing.T) {
	if _, err := launchContainer(fakeContainer(), "TEST_AMQP_URL", time.Minute); err == nil || !strings.Contains(err.Error(), "TEST_REDIS_URL=") {
		t.Errorf("wrong variable: err %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if _, err := launchContainer(cmd, "TEST_REDIS_URL", time.Minute); err == nil {
		t.Error("a program that printed no address: no error")
	}
}
