package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// scriptTimeout bounds one run of services.sh from a test.
const scriptTimeout = 5 * time.Minute

// Restart stops the service and starts it again on the same port with the
// same data directory, and returns once it answers again. It fails the test,
// with the script's output, if that does not work. Only an instance that
// services.sh started (or a container this process started) can be
// restarted. Other test packages running at the same time see the outage too.
func Restart(t testing.TB, service string) {
	t.Helper()
	control(t, "restart", service)
}

// Stop stops the service, for tests of what happens while a broker is down.
// A cleanup registered on t starts it again if the test does not call Start.
func Stop(t testing.TB, service string) {
	t.Helper()
	control(t, "stop", service)
	t.Cleanup(func() {
		if err := run(context.Background(), "start", service); err != nil {
			t.Errorf("testenv: restarting %s after the test: %v", service, err)
		}
	})
}

// Kill kills the service with SIGKILL, for tests of a node that dies
// without a controlled shutdown (services.sh only). A cleanup registered on
// t starts it again if the test does not call Start.
func Kill(t testing.TB, service string) {
	t.Helper()
	control(t, "kill", service)
	t.Cleanup(func() {
		if err := run(context.Background(), "start", service); err != nil {
			t.Errorf("testenv: restarting %s after the test: %v", service, err)
		}
	})
}

// Start starts the service again after Stop and returns once it answers.
func Start(t testing.TB, service string) {
	t.Helper()
	control(t, "start", service)
}

func control(t testing.TB, command, service string) {
	t.Helper()
	if _, ok := services[service]; !ok && !isProfileNode(service) {
		t.Fatalf("testenv: unknown service %q (known: %s, %s, %s, %s, %s)",
			service, Postgres, Redis, RabbitMQ, Kafka, ElasticMQ)
	}
	if err := run(context.Background(), command, service); err != nil {
		t.Fatalf("testenv: %s %s: %v", command, service, err)
	}
}

// run bounces a service: through its container when this process started
// one, else through services.sh.
func run(ctx context.Context, command, service string) error {
	ctx, cancel := context.WithTimeout(ctx, scriptTimeout)
	defer cancel()
	if ok, err := controlContainer(ctx, command, service); ok {
		return err
	}
	script, err := ScriptPath()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "bash", script, command, service)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("bash %s %s %s: %w\n%s", script, command, service, err, out)
	}
	return nil
}

// ScriptPath returns the path of testdata/services/services.sh, found by
// walking up from the working directory to the module root (the directory
// holding go.mod).
func ScriptPath() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", fmt.Errorf("find services.sh: %w", err)
	}
	script := filepath.Join(root, "testdata", "services", "services.sh")
	if _, err := os.Stat(script); err != nil {
		return "", fmt.Errorf("find services.sh: %w", err)
	}
	return script, nil
}

// isProfileNode reports whether service names a node of the Redis Cluster
// or Sentinel profile.
func isProfileNode(service string) bool {
	for i := 1; i <= RedisClusterNodes; i++ {
		if service == RedisClusterNode(i) {
			return true
		}
	}
	for i := 1; i <= 3; i++ {
		if service == KafkaClusterNode(i) || service == fmt.Sprintf("sentinel-%d", i) {
			return true
		}
	}
	return service == RedisSentinelNode(1) || service == RedisSentinelNode(2)
}
