package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Service names, as services.sh, Restart, Stop and Start know them.
const (
	Postgres  = "postgres"
	Redis     = "redis"
	RabbitMQ  = "rabbitmq"
	Kafka     = "kafka"
	ElasticMQ = "elasticmq"

	// RedisCluster is the optional Redis Cluster profile: three masters
	// and three replicas, nodes RedisClusterNode(1) .. RedisClusterNode(6).
	RedisCluster = "redis-cluster"

	// RedisSentinel is the optional Sentinel profile: a primary and its
	// replica, RedisSentinelNode(1) and (2), watched by three Sentinels
	// that know the primary as RedisSentinelMaster.
	RedisSentinel = "redis-sentinel"

	// KafkaCluster is the optional Kafka cluster profile: three KRaft
	// nodes, KafkaClusterNode(1) .. (3), replication factor 3 and
	// min.insync.replicas 2 by default.
	KafkaCluster = "kafka-cluster"
)

// KafkaClusterNode returns the service name of node i (1 to 3) of the Kafka
// cluster, for Stop, Kill, Start and Restart.
func KafkaClusterNode(i int) string { return fmt.Sprintf("%s-%d", KafkaCluster, i) }

// RedisSentinelMaster is the master name the Sentinels of the
// RedisSentinel profile monitor.
const RedisSentinelMaster = "idemq"

// RedisSentinelNode returns the service name of data node i (1 or 2) of the
// Sentinel profile, for Stop, Start and Restart.
func RedisSentinelNode(i int) string { return fmt.Sprintf("%s-%d", RedisSentinel, i) }

// RedisClusterNodes is the number of nodes of the RedisCluster profile.
const RedisClusterNodes = 6

// RedisClusterNode returns the service name of node i (1 to
// RedisClusterNodes) of the Redis Cluster, for Stop, Start and Restart.
func RedisClusterNode(i int) string { return fmt.Sprintf("%s-%d", RedisCluster, i) }

// Environment variables that override the addresses of the services.
const (
	EnvDatabaseURL  = "TEST_DATABASE_URL"
	EnvRedisURL     = "TEST_REDIS_URL"
	EnvAMQPURL      = "TEST_AMQP_URL"
	EnvKafkaBrokers = "TEST_KAFKA_BROKERS" // comma-separated host:port list
	EnvSQSEndpoint  = "TEST_SQS_ENDPOINT"
	// EnvRedisClusterAddrs is a comma-separated host:port list of the
	// Redis Cluster's nodes.
	EnvRedisClusterAddrs = "TEST_REDIS_CLUSTER_ADDRS"
	// EnvRedisSentinelAddrs is a comma-separated host:port list of the
	// Sentinels.
	EnvRedisSentinelAddrs = "TEST_REDIS_SENTINEL_ADDRS"
	// EnvKafkaClusterBrokers is a comma-separated host:port list of the
	// Kafka cluster's brokers.
	EnvKafkaClusterBrokers = "TEST_KAFKA_CLUSTER_BROKERS"

	// EnvServicesDir overrides the state directory of services.sh.
	EnvServicesDir = "IDEMQ_SERVICES_DIR"
)

// Default loopback addresses, as services.sh starts the services.
const (
	DefaultDatabaseURL  = "postgres://postgres@127.0.0.1:5432/idemq_test?sslmode=disable"
	DefaultRedisURL     = "redis://127.0.0.1:6379/0"
	DefaultAMQPURL      = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultKafkaBrokers = "127.0.0.1:9092"
	DefaultSQSEndpoint  = "http://127.0.0.1:9324"

	DefaultRedisClusterAddrs   = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005,127.0.0.1:7006"
	DefaultRedisSentinelAddrs  = "127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381"
	DefaultKafkaClusterBrokers = "127.0.0.1:9191,127.0.0.1:9192,127.0.0.1:9193"
)

// Settings an SQS client needs for the local SQS-compatible server, which
// accepts any static credentials.
const (
	SQSRegion          = "us-east-1"
	SQSAccessKeyID     = "test"
	SQSSecretAccessKey = "test"
)

// dialTimeout bounds the check that an address answers.
const dialTimeout = 500 * time.Millisecond

type service struct {
	name   string
	envVar string
	def    string
	// hostPort extracts the address to dial from a value of envVar.
	hostPort func(value string) (string, error)
}

var services = map[string]service{
	Postgres:  {Postgres, EnvDatabaseURL, DefaultDatabaseURL, urlHostPort},
	Redis:     {Redis, EnvRedisURL, DefaultRedisURL, urlHostPort},
	RabbitMQ:  {RabbitMQ, EnvAMQPURL, DefaultAMQPURL, urlHostPort},
	Kafka:     {Kafka, EnvKafkaBrokers, DefaultKafkaBrokers, firstBroker},
	ElasticMQ: {ElasticMQ, EnvSQSEndpoint, DefaultSQSEndpoint, urlHostPort},

	RedisCluster:  {RedisCluster, EnvRedisClusterAddrs, DefaultRedisClusterAddrs, firstBroker},
	RedisSentinel: {RedisSentinel, EnvRedisSentinelAddrs, DefaultRedisSentinelAddrs, firstBroker},
	KafkaCluster:  {KafkaCluster, EnvKafkaClusterBrokers, DefaultKafkaClusterBrokers, firstBroker},
}

// DatabaseURL returns the PostgreSQL connection URL for tests. Tests that
// create tables should work in their own schema: see Schema and SchemaURL.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	return resolve(t, Postgres)
}

// RedisURL returns the Redis URL for tests (redis://host:port/db).
func RedisURL(t testing.TB) string {
	t.Helper()
	return resolve(t, Redis)
}

// AMQPURL returns the RabbitMQ AMQP 0-9-1 URL for tests.
func AMQPURL(t testing.TB) string {
	t.Helper()
	return resolve(t, RabbitMQ)
}

// KafkaBrokers returns the Kafka bootstrap addresses (host:port) for tests.
func KafkaBrokers(t testing.TB) []string {
	t.Helper()
	return splitBrokers(resolve(t, Kafka))
}

// RedisClusterAddrs returns the addresses (host:port) of the Redis Cluster's
// nodes, for redis.NewClusterClient. Start the cluster with
// `bash testdata/services/services.sh up redis-cluster` (make services does).
func RedisClusterAddrs(t testing.TB) []string {
	t.Helper()
	return splitBrokers(resolve(t, RedisCluster))
}

// RedisSentinelAddrs returns the addresses (host:port) of the Sentinels that
// watch RedisSentinelMaster, for redis.NewFailoverClient. Start them with
// `bash testdata/services/services.sh up redis-sentinel` (make services
// does).
func RedisSentinelAddrs(t testing.TB) []string {
	t.Helper()
	return splitBrokers(resolve(t, RedisSentinel))
}

// KafkaClusterBrokers returns the bootstrap addresses of the three-node
// Kafka cluster. Start it with `bash testdata/services/services.sh up
// kafka-cluster` (make services does).
func KafkaClusterBrokers(t testing.TB) []string {
	t.Helper()
	return splitBrokers(resolve(t, KafkaCluster))
}

// SQSEndpoint returns the base URL of the SQS-compatible server for tests.
// Use it as the SQS client's BaseEndpoint, with SQSRegion and the static
// credentials SQSAccessKeyID and SQSSecretAccessKey.
func SQSEndpoint(t testing.TB) string {
	t.Helper()
	return resolve(t, ElasticMQ)
}

// StateDir returns the state directory of services.sh: $IDEMQ_SERVICES_DIR,
// or $HOME/.cache/idemq/services.
func StateDir() string {
	if d := os.Getenv(EnvServicesDir); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "idemq", "services")
}

var resolved sync.Map // service name -> string, addresses that answered

// short reports whether the tests run with -short; a variable for the
// package's own tests of resolve.
var short = func() bool { return testing.Testing() && testing.Short() }

func resolve(t testing.TB, name string) string {
	t.Helper()
	if short() {
		t.Skipf("testenv: needs %s; skipped with -short, which runs only tests that need no service", name)
	}
	svc := services[name]
	if v := os.Getenv(svc.envVar); v != "" {
		return v
	}
	if v, ok := resolved.Load(name); ok {
		return v.(string)
	}
	envFile := filepath.Join(StateDir(), "env")
	vars, fileErr := readEnvFile(envFile)
	if v := vars[svc.envVar]; v != "" && answers(svc, v) {
		resolved.Store(name, v)
		return v
	}
	if answers(svc, svc.def) {
		resolved.Store(name, svc.def)
		return svc.def
	}
	v, err := startContainer(t, name)
	if err == nil {
		resolved.Store(name, v)
		return v
	}
	hp, _ := svc.hostPort(svc.def)
	var fileNote string
	switch {
	case errors.Is(fileErr, os.ErrNotExist):
		fileNote = envFile + " does not exist"
	case fileErr != nil:
		fileNote = fmt.Sprintf("%s cannot be read (%v)", envFile, fileErr)
	case vars[svc.envVar] == "":
		fileNote = fmt.Sprintf("%s has no %s", envFile, svc.envVar)
	default:
		fileNote = fmt.Sprintf("%s in %s does not answer", vars[svc.envVar], envFile)
	}
	t.Fatalf("testenv: no %s for this test: %s is unset, %s, nothing answers on %s, and %v.\n"+
		"Run `make services` (or `bash testdata/services/services.sh up %s`) first, or set %s.",
		name, svc.envVar, fileNote, hp, err, name, svc.envVar)
	return ""
}

// answers reports whether the service address in value accepts a TCP
// connection within dialTimeout.
func answers(svc service, value string) bool {
	hp, err := svc.hostPort(value)
	if err != nil {
		return false
	}
	conn, err := net.DialTimeout("tcp", hp, dialTimeout)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// urlHostPort returns host:port of a service URL, with the scheme's default
// port when the URL has none.
func urlHostPort(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("parse %q: %w", raw, err)
	}
	if u.Host == "" {
		return "", fmt.Errorf("parse %q: no host", raw)
	}
	if u.Port() != "" {
		return u.Host, nil
	}
	port, ok := map[string]string{
		"postgres": "5432", "postgresql": "5432", "redis": "6379", "rediss": "6379",
		"amqp": "5672", "amqps": "5671", "http": "80", "https": "443",
	}[u.Scheme]
	if !ok {
		return "", fmt.Errorf("parse %q: no port and unknown scheme", raw)
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

func firstBroker(raw string) (string, error) {
	brokers := splitBrokers(raw)
	if len(brokers) == 0 {
		return "", fmt.Errorf("no broker in %q", raw)
	}
	return brokers[0], nil
}

func splitBrokers(raw string) []string {
	var out []string
	for b := range strings.SplitSeq(raw, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// readEnvFile parses the `export NAME='value'` lines that services.sh
// writes. Blank lines and # comments are skipped; the value may be single-
// or double-quoted.
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	vars := make(map[string]string)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.TrimSpace(strings.TrimPrefix(line, "export "))
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		if n := len(value); n >= 2 && (value[0] == '\'' || value[0] == '"') && value[n-1] == value[0] {
			value = value[1 : n-1]
		}
		vars[strings.TrimSpace(name)] = value
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return vars, nil
}

// FreePort returns a loopback TCP port that was free a moment ago, for a
// server of a test's own (a private Redis, Kafka or ElasticMQ). Another
// process may take it before the server binds it; a server that cannot
// bind fails its start.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: pick a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
