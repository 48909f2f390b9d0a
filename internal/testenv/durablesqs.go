package testenv

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// DurableSQS is an SQS-compatible server (ElasticMQ) of one test's own that
// keeps its queues and messages, in-flight ones with their visibility
// deadline, in a database file, so that a restart loses nothing, as on real
// SQS. The shared ElasticMQ that services.sh starts keeps everything in
// memory, and restarting it would disturb every test using it; a test of
// what survives a broker restart starts a DurableSQS instead.
//
// It runs the ElasticMQ jars that services.sh installed, on a free loopback
// port, with its data under t.TempDir(), and is killed when the test ends.
type DurableSQS struct {
	// Endpoint is the server's URL, for the SQS client's BaseEndpoint (with
	// SQSRegion and the static credentials SQSAccessKeyID and
	// SQSSecretAccessKey).
	Endpoint string

	classpath, config, log string
	cmd                    *exec.Cmd
	exited                 chan struct{}
}

// durableSQSStart bounds how long the server may take to answer.
const durableSQSStart = 90 * time.Second

// StartDurableSQS starts a DurableSQS and returns once it answers. It skips
// the test when ElasticMQ is not installed in StateDir() (services.sh up
// elasticmq installs it) or java is missing, and fails it when the server
// does not come up.
func StartDurableSQS(t testing.TB) *DurableSQS {
	t.Helper()
	lib := filepath.Join(StateDir(), ElasticMQ, "lib")
	if jars, _ := filepath.Glob(filepath.Join(lib, "*.jar")); len(jars) == 0 {
		t.Skipf("testenv: no ElasticMQ jars in %s; run: bash testdata/services/services.sh up elasticmq", lib)
	}
	if _, err := exec.LookPath("java"); err != nil {
		t.Skip("testenv: java not found; run: bash testdata/services/services.sh up elasticmq")
	}
	port := FreePort(t)

	dir := t.TempDir()
	d := &DurableSQS{
		Endpoint:  "http://127.0.0.1:" + strconv.Itoa(port),
		classpath: filepath.Join(lib, "*"),
		config:    filepath.Join(dir, "elasticmq.conf"),
		log:       filepath.Join(dir, "elasticmq.log"),
	}
	conf := fmt.Sprintf(`include classpath("application.conf")
node-address { protocol = http, host = 127.0.0.1, port = %[1]d, context-path = "" }
rest-sqs { enabled = true, bind-port = %[1]d, bind-hostname = "127.0.0.1", sqs-limits = strict }
rest-stats { enabled = false }
aws { region = %[2]q, accountId = "000000000000" }
messages-storage { enabled = true, uri = "jdbc:h2:%[3]s/messages" }
`, port, SQSRegion, filepath.Join(dir, "data"))
	if err := os.WriteFile(d.config, []byte(conf), 0o600); err != nil {
		t.Fatalf("testenv: write ElasticMQ config: %v", err)
	}
	t.Cleanup(d.kill)
	d.start(t)
	return d
}

// Restart stops the server (SIGTERM) and starts it again on the same port
// with the same data, and returns once it answers.
func (d *DurableSQS) Restart(t testing.TB) {
	t.Helper()
	d.stop()
	d.start(t)
}

func (d *DurableSQS) start(t testing.TB) {
	t.Helper()
	logf, err := os.OpenFile(d.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatalf("testenv: ElasticMQ log: %v", err)
	}
	defer logf.Close()
	cmd := exec.Command("java", "-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError",
		"-Djava.awt.headless=true", "-Dconfig.file="+d.config, "-cp", d.classpath, "org.elasticmq.server.Main")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start ElasticMQ: %v", err)
	}
	d.cmd, d.exited = cmd, make(chan struct{})
	go func(exited chan struct{}) {
		_ = cmd.Wait()
		close(exited)
	}(d.exited)

	ctx, cancel := context.WithTimeout(context.Background(), durableSQSStart)
	defer cancel()
	for {
		if d.answers(ctx) {
			return
		}
		select {
		case <-d.exited:
			t.Fatalf("testenv: ElasticMQ exited at start; log %s:\n%s", d.log, tail(d.log))
		case <-ctx.Done():
			t.Fatalf("testenv: ElasticMQ did not answer within %s; log %s:\n%s", durableSQSStart, d.log, tail(d.log))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// answers reports whether the server answers an SQS ListQueues call.
func (d *DurableSQS) answers(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.Endpoint+"/?Action=ListQueues", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// stop ends the server, SIGTERM first (ElasticMQ closes its database), and
// waits for it to exit.
func (d *DurableSQS) stop() {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
	d.cmd = nil
}

// kill ends the server at the end of its test with SIGKILL and waits for it
// to exit: nothing it stored is read again, so it is spared the orderly
// shutdown that stop gives a Restart.
func (d *DurableSQS) kill() {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Kill()
	<-d.exited
	d.cmd = nil
}

// tail returns the last lines of a log file, for a failure message.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}
