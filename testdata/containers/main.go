// Command containers starts one of the services idemq's tests need in a
// Docker container, through testcontainers-go, for machines with a Docker
// engine and without the services that testdata/services/services.sh runs.
// internal/testenv runs it (go run . <service>) as a last resort when no
// address answers; it is a module of its own so that idemq's module, and
// every module that imports idemq, never depends on testcontainers-go or
// the Docker client.
//
//	go run . postgres|redis|rabbitmq|kafka|elasticmq
//
// It publishes the service on a free loopback port (never the fixed port
// that a local service may hold), prints one line NAME=address with the
// environment variable that internal/testenv reads, and then serves commands
// on stdin, one per line, answering "ok" or "error: ..." on stdout:
//
//	stop     stops the container
//	start    starts it again, on the same port
//	restart  both
//
// When stdin ends (the test process exited) it removes the container; the
// testcontainers reaper removes it too if this program is killed.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

const startTimeout = 3 * time.Minute

// spec describes a service's container. The functions get the host port
// the service is published on.
type spec struct {
	image   string
	port    uint16 // inside the container
	env     func(hostPort int) map[string]string
	cmd     []string
	wait    func() wait.Strategy
	address func(hostPort int) (envVar, value string)
}

var specs = map[string]spec{
	"postgres": {
		image: "postgres:15-alpine",
		port:  5432,
		env: func(int) map[string]string {
			return map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust", "POSTGRES_DB": "idemq_test"}
		},
		wait: func() wait.Strategy {
			return wait.ForAll(
				wait.ForLog("database system is ready to accept connections").WithOccurrence(2),
				wait.ForListeningPort("5432/tcp"))
		},
		address: func(p int) (string, string) {
			return "TEST_DATABASE_URL", fmt.Sprintf("postgres://postgres@127.0.0.1:%d/idemq_test?sslmode=disable", p)
		},
	},
	"redis": {
		image:   "redis:7-alpine",
		port:    6379,
		cmd:     []string{"redis-server", "--save", "", "--appendonly", "no"},
		wait:    func() wait.Strategy { return wait.ForListeningPort("6379/tcp") },
		address: func(p int) (string, string) { return "TEST_REDIS_URL", fmt.Sprintf("redis://127.0.0.1:%d/0", p) },
	},
	"rabbitmq": {
		image: "rabbitmq:3.13-alpine",
		port:  5672,
		wait: func() wait.Strategy {
			return wait.ForAll(wait.ForLog("Server startup complete"), wait.ForListeningPort("5672/tcp"))
		},
		address: func(p int) (string, string) {
			return "TEST_AMQP_URL", fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", p)
		},
	},
	"kafka": {
		image: "apache/kafka:4.0.0",
		port:  9092,
		env: func(p int) map[string]string {
			return map[string]string{
				"KAFKA_NODE_ID":                                          "1",
				"KAFKA_PROCESS_ROLES":                                    "broker,controller",
				"KAFKA_LISTENERS":                                        "PLAINTEXT://:9092,CONTROLLER://:9093",
				"KAFKA_ADVERTISED_LISTENERS":                             "PLAINTEXT://127.0.0.1:" + strconv.Itoa(p),
				"KAFKA_CONTROLLER_LISTENER_NAMES":                        "CONTROLLER",
				"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":                   "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
				"KAFKA_CONTROLLER_QUORUM_VOTERS":                         "1@localhost:9093",
				"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":                 "1",
				"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR":         "1",
				"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":                    "1",
				"KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
				"KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR":            "1",
				"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":                 "0",
				"KAFKA_NUM_PARTITIONS":                                   "4",
				"KAFKA_AUTO_CREATE_TOPICS_ENABLE":                        "true",
			}
		},
		wait: func() wait.Strategy {
			return wait.ForAll(wait.ForLog("Kafka Server started"), wait.ForListeningPort("9092/tcp"))
		},
		address: func(p int) (string, string) { return "TEST_KAFKA_BROKERS", "127.0.0.1:" + strconv.Itoa(p) },
	},
	"elasticmq": {
		image:   "softwaremill/elasticmq-native:1.7.1",
		port:    9324,
		wait:    func() wait.Strategy { return wait.ForListeningPort("9324/tcp") },
		address: func(p int) (string, string) { return "TEST_SQS_ENDPOINT", "http://127.0.0.1:" + strconv.Itoa(p) },
	},
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: containers postgres|redis|rabbitmq|kafka|elasticmq")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "containers:", err)
		os.Exit(1)
	}
}

func run(name string) error {
	s, ok := specs[name]
	if !ok {
		return fmt.Errorf("unknown service %q", name)
	}
	hostPort, err := freePort()
	if err != nil {
		return err
	}
	inner := network.MustParsePort(strconv.Itoa(int(s.port)) + "/tcp")
	req := testcontainers.ContainerRequest{
		Image:        s.image,
		ExposedPorts: []string{inner.String()},
		Cmd:          s.cmd,
		WaitingFor:   s.wait(),
		HostConfigModifier: func(hc *container.HostConfig) {
			// A fixed host port of our choosing, so that a restarted
			// container serves the same address.
			hc.PortBindings = network.PortMap{inner: {{
				HostIP:   netip.MustParseAddr("127.0.0.1"),
				HostPort: strconv.Itoa(hostPort),
			}}}
		},
	}
	if s.env != nil {
		req.Env = s.env(hostPort)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{ContainerRequest: req, Started: true})
	if c != nil {
		defer func() { _ = c.Terminate(context.Background()) }()
	}
	if err != nil {
		return fmt.Errorf("start %s (%s): %w", name, s.image, err)
	}
	envVar, addr := s.address(hostPort)
	fmt.Printf("%s=%s\n", envVar, addr)

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if err := control(c, in.Text()); err != nil {
			fmt.Printf("error: %v\n", err)
			continue
		}
		fmt.Println("ok")
	}
	return in.Err()
}

// control stops, starts or restarts the container.
func control(c testcontainers.Container, command string) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	timeout := 30 * time.Second
	switch command {
	case "stop", "start", "restart":
	default:
		return fmt.Errorf("unknown command %q", command)
	}
	if command != "start" {
		if err := c.Stop(ctx, &timeout); err != nil {
			return fmt.Errorf("stop: %w", err)
		}
	}
	if command != "stop" && !c.IsRunning() {
		if err := c.Start(ctx); err != nil {
			return fmt.Errorf("start: %w", err)
		}
	}
	return nil
}

// freePort returns a loopback TCP port that nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a port: %w", err)
	}
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, errors.New("pick a port: not a TCP address")
	}
	return addr.Port, nil
}
