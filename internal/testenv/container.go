package testenv

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// This file is the last resort of the resolution: a container started with
// testcontainers-go when a Docker engine answers. Each container publishes
// its service on the same fixed loopback port that services.sh uses, so the
// default addresses apply, and it lives for the rest of the test process
// (testcontainers' reaper removes it when the process ends).

const containerStartTimeout = 3 * time.Minute

type containerSpec struct {
	image string
	port  uint16
	env   map[string]string
	cmd   []string
	wait  func() wait.Strategy
}

var containerSpecs = map[string]containerSpec{
	Postgres: {
		image: "postgres:15-alpine",
		port:  5432,
		env:   map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust", "POSTGRES_DB": "idemq_test"},
		wait: func() wait.Strategy {
			return wait.ForAll(
				wait.ForLog("database system is ready to accept connections").WithOccurrence(2),
				wait.ForListeningPort("5432/tcp"))
		},
	},
	Redis: {
		image: "redis:7-alpine",
		port:  6379,
		cmd:   []string{"redis-server", "--save", "", "--appendonly", "no"},
		wait:  func() wait.Strategy { return wait.ForListeningPort("6379/tcp") },
	},
	RabbitMQ: {
		image: "rabbitmq:3.13-alpine",
		port:  5672,
		wait: func() wait.Strategy {
			return wait.ForAll(wait.ForLog("Server startup complete"), wait.ForListeningPort("5672/tcp"))
		},
	},
	Kafka: {
		image: "apache/kafka:4.0.0",
		port:  9092,
		env: map[string]string{
			"KAFKA_NODE_ID":                                          "1",
			"KAFKA_PROCESS_ROLES":                                    "broker,controller",
			"KAFKA_LISTENERS":                                        "PLAINTEXT://:9092,CONTROLLER://:9093",
			"KAFKA_ADVERTISED_LISTENERS":                             "PLAINTEXT://127.0.0.1:9092",
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
		},
		wait: func() wait.Strategy {
			return wait.ForAll(wait.ForLog("Kafka Server started"), wait.ForListeningPort("9092/tcp"))
		},
	},
	ElasticMQ: {
		image: "softwaremill/elasticmq-native:1.7.1",
		port:  9324,
		wait:  func() wait.Strategy { return wait.ForListeningPort("9324/tcp") },
	},
}

var (
	dockerOnce sync.Once
	dockerErr  error

	containersMu sync.Mutex
	containers   = map[string]testcontainers.Container{}
)

// dockerHealthy reports, once per process, whether a Docker engine answers.
func dockerHealthy() (err error) {
	dockerOnce.Do(func() {
		defer func() {
			if r := recover(); r != nil {
				dockerErr = fmt.Errorf("no Docker engine answers for testcontainers: %v", r)
			}
		}()
		p, err := testcontainers.NewDockerProvider()
		if err != nil {
			dockerErr = fmt.Errorf("no Docker engine answers for testcontainers: %w", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.Health(ctx); err != nil {
			dockerErr = fmt.Errorf("no Docker engine answers for testcontainers: %w", err)
		}
	})
	return dockerErr
}

// startContainer starts the service's container once per process and
// returns the service's default address, which the container serves.
func startContainer(t testing.TB, name string) (string, error) {
	t.Helper()
	if err := dockerHealthy(); err != nil {
		return "", err
	}
	containersMu.Lock()
	defer containersMu.Unlock()
	def := services[name].def
	if _, ok := containers[name]; ok {
		return def, nil
	}
	spec := containerSpecs[name]
	port := network.MustParsePort(strconv.Itoa(int(spec.port)) + "/tcp")
	req := testcontainers.ContainerRequest{
		Image:        spec.image,
		ExposedPorts: []string{port.String()},
		Env:          spec.env,
		Cmd:          spec.cmd,
		WaitingFor:   spec.wait(),
		HostConfigModifier: func(hc *container.HostConfig) {
			hc.PortBindings = network.PortMap{port: {{
				HostIP:   netip.MustParseAddr("127.0.0.1"),
				HostPort: strconv.Itoa(int(spec.port)),
			}}}
		},
	}
	t.Logf("testenv: starting %s in a container (%s)", name, spec.image)
	ctx, cancel := context.WithTimeout(context.Background(), containerStartTimeout)
	defer cancel()
	c, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: req,
		Started:          true,
	})
	if err != nil {
		if c != nil {
			_ = c.Terminate(context.Background())
		}
		return "", fmt.Errorf("start %s container %s: %w", name, spec.image, err)
	}
	containers[name] = c
	return def, nil
}

// controlContainer stops, starts or restarts the service's container if this
// process started one; ok is false when it did not.
func controlContainer(ctx context.Context, command, service string) (ok bool, err error) {
	containersMu.Lock()
	defer containersMu.Unlock()
	c, found := containers[service]
	if !found {
		return false, nil
	}
	timeout := 30 * time.Second
	if command == "stop" || command == "restart" {
		if err := c.Stop(ctx, &timeout); err != nil {
			return true, fmt.Errorf("stop %s container: %w", service, err)
		}
	}
	if (command == "start" || command == "restart") && !c.IsRunning() {
		if err := c.Start(ctx); err != nil {
			return true, fmt.Errorf("start %s container: %w", service, err)
		}
	}
	return true, nil
}
