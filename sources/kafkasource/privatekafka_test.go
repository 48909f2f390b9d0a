package kafkasource_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/internal/testenv"
)

// privateKafka is a single-node Kafka (KRaft) of one test's own, run from the
// jars services.sh installed, on free loopback ports with its data under
// t.TempDir(), so that a test may restart it without disturbing the shared
// broker. It is killed when the test ends.
type privateKafka struct {
	Addr string

	classpath, props, log, log4j string
	cmd                          *exec.Cmd
	exited                       chan struct{}
}

// privateKafkaStart bounds how long the broker may take to answer.
const privateKafkaStart = 3 * time.Minute

// startKafka starts a privateKafka and returns once it answers a metadata
// request. It skips t with -short, and when the Kafka jars (services.sh up
// kafka) or java are missing.
func startKafka(t testing.TB) *privateKafka {
	t.Helper()
	skipShort(t)
	lib := filepath.Join(testenv.StateDir(), testenv.Kafka, "lib")
	if jars, _ := filepath.Glob(filepath.Join(lib, "kafka_*.jar")); len(jars) == 0 {
		t.Skipf("no Kafka jars in %s; run: bash testdata/services/services.sh up kafka", lib)
	}
	if _, err := exec.LookPath("java"); err != nil {
		t.Skip("java not found; run: bash testdata/services/services.sh up kafka")
	}
	conf, err := filepath.Abs(filepath.Join("..", "..", "testdata", "services", "kafka"))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := os.ReadFile(filepath.Join(conf, "server.properties"))
	if err != nil {
		t.Fatal(err)
	}
	port, controller := testenv.FreePort(t), testenv.FreePort(t)
	dir := t.TempDir()
	k := &privateKafka{
		Addr:      "127.0.0.1:" + strconv.Itoa(port),
		classpath: filepath.Join(lib, "*"),
		props:     filepath.Join(dir, "server.properties"),
		log:       filepath.Join(dir, "kafka.log"),
		log4j:     "-Dlog4j2.configurationFile=" + filepath.Join(conf, "log4j2.xml"),
	}
	props := strings.NewReplacer("@DATA_DIR@", filepath.Join(dir, "data"), "@PORT@", strconv.Itoa(port),
		"@CONTROLLER_PORT@", strconv.Itoa(controller)).Replace(string(tmpl))
	if err := os.WriteFile(k.props, []byte(props), 0o600); err != nil {
		t.Fatal(err)
	}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	format := exec.Command("java", k.log4j, "-cp", k.classpath, "kafka.tools.StorageTool", "format",
		"--cluster-id="+base64.RawURLEncoding.EncodeToString(id), "-c", k.props)
	if out, err := format.CombinedOutput(); err != nil {
		t.Fatalf("format Kafka storage: %v\n%s", err, out)
	}
	t.Cleanup(k.kill)
	k.start(t)
	return k
}

func (k *privateKafka) start(t testing.TB) {
	t.Helper()
	logf, err := os.OpenFile(k.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	k.cmd = exec.Command("java", "-Xms256m", "-Xmx384m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
		k.log4j, "-cp", k.classpath, "kafka.Kafka", k.props)
	k.cmd.Stdout, k.cmd.Stderr = logf, logf
	if err := k.cmd.Start(); err != nil {
		t.Fatalf("start Kafka: %v", err)
	}
	k.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) { _ = cmd.Wait(); close(exited) }(k.cmd, k.exited)
	deadline := time.Now().Add(privateKafkaStart)
	for !k.answers() {
		select {
		case <-k.exited:
			t.Fatalf("Kafka exited at start; see %s", k.log)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("Kafka on %s did not answer within %s; see %s", k.Addr, privateKafkaStart, k.log)
		}
	}
}

// answers reports whether the broker answers a metadata request that lists
// it (registered and unfenced).
func (k *privateKafka) answers() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := kafka.DialContext(ctx, "tcp", k.Addr)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	b, err := c.Brokers()
	return err == nil && len(b) > 0
}

// stop stops the broker (SIGTERM, a controlled shutdown) and returns once it
// exited; start runs it again on the same ports and data and returns once it
// answers.
func (k *privateKafka) stop(t testing.TB) {
	t.Helper()
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.exited:
	case <-time.After(time.Minute):
		t.Fatal("Kafka did not stop within a minute of SIGTERM")
	}
}

func (k *privateKafka) kill() {
	if k.cmd == nil {
		return
	}
	_ = k.cmd.Process.Kill()
	<-k.exited
	k.cmd = nil
}
