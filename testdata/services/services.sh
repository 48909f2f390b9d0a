#!/usr/bin/env bash
# services.sh - installs and runs the real services that idemq's tests use,
# bound to 127.0.0.1 on fixed ports:
#
#   postgres   PostgreSQL (Debian cluster "15 main")    127.0.0.1:5432
#   redis      Redis (no persistence)                   127.0.0.1:6379
#   rabbitmq   RabbitMQ                                 127.0.0.1:5672
#   kafka      Apache Kafka, KRaft, jars from Maven     127.0.0.1:9092 (controller 9093)
#   elasticmq  ElasticMQ (SQS API), jars from Maven     127.0.0.1:9324
#
# Optional profile (not part of the default five):
#   redis-cluster  a Redis Cluster of 3 masters and 3 replicas, nodes
#                  redis-cluster-1 .. redis-cluster-6 on 127.0.0.1:7001-7006;
#                  each node can be stopped and started on its own
#   kafka-cluster  three Apache Kafka KRaft nodes (kafka-cluster-1 .. -3,
#                  brokers on 127.0.0.1:9191-9193, controllers 9291-9293),
#                  replication factor 3, min.insync.replicas 2; each node
#                  can be stopped and started on its own
#   redis-sentinel a Redis primary and replica (redis-sentinel-1, -2 on
#                  127.0.0.1:7101-7102) watched by three Sentinels
#                  (sentinel-1 .. -3 on 127.0.0.1:26379-26381), master name
#                  "idemq"; each node can be stopped and started on its own
#
# Usage:
#   services.sh up      [svc...]   start what does not answer yet (default: all five)
#   services.sh down    [svc...]   stop what this script started (default: all five)
#   services.sh start   <svc...>   same as up
#   services.sh stop    <svc...>   stop a service this script started
#   services.sh kill    <svc...>   SIGKILL it instead (a node that dies)
#   services.sh restart <svc...>   stop, then start again on the same port and data dir
#   services.sh status  [svc...]   print whether each service answers
#   services.sh env                print `export VAR=value` lines for the tests
#   services.sh browser            install Chromium (Debian package chromium) when missing
#
# A service that already answers on its port (checked at protocol level) is used
# as it is and never stopped by this script. State - data directories, logs, pid
# files, downloaded jars and the env file - lives in
# ${IDEMQ_SERVICES_DIR:-$HOME/.cache/idemq/services}, never in the repository.
# IDEMQ_SERVICES_TIMEOUT (seconds, default 180) bounds each readiness wait.
# Installing packages needs root (or password-less sudo).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE_DIR="${IDEMQ_SERVICES_DIR:-${HOME:-/root}/.cache/idemq/services}"
TIMEOUT="${IDEMQ_SERVICES_TIMEOUT:-180}"
export DEBIAN_FRONTEND=noninteractive

ALL_SERVICES=(postgres redis rabbitmq kafka elasticmq)
REDIS_CLUSTER_BASE_PORT=7000
REDIS_CLUSTER_NODES=(redis-cluster-1 redis-cluster-2 redis-cluster-3 redis-cluster-4 redis-cluster-5 redis-cluster-6)
REDIS_SENTINEL_BASE_PORT=7100
KAFKA_CLUSTER_BASE_PORT=9190
KAFKA_CLUSTER_CONTROLLER_BASE_PORT=9290
KAFKA_CLUSTER_NODES=(kafka-cluster-1 kafka-cluster-2 kafka-cluster-3)
KAFKA_CLUSTER_HEAP="-Xms256m -Xmx384m"
SENTINEL_BASE_PORT=26378
SENTINEL_MASTER=idemq
REDIS_SENTINEL_NODES=(redis-sentinel-1 redis-sentinel-2 sentinel-1 sentinel-2 sentinel-3)

PG_VERSION=15
PG_CLUSTER=main
PG_PORT=5432
PG_DATABASE=idemq_test
REDIS_PORT=6379
AMQP_PORT=5672
KAFKA_PORT=9092
KAFKA_CONTROLLER_PORT=9093
SQS_PORT=9324

KAFKA_HEAP="-Xms512m -Xmx512m"
ELASTICMQ_HEAP="-Xms64m -Xmx256m"

log() { printf 'services: %s\n' "$*" >&2; }
die() {
	printf 'services: error: %s\n' "$*" >&2
	exit 1
}

now() { date +%s; }

# as_root runs a command as root, through password-less sudo when needed.
as_root() {
	if [ "$(id -u)" = 0 ]; then
		"$@"
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		sudo -n "$@"
	else
		die "need root (or password-less sudo) to run: $*"
	fi
}

APT_UPDATED=
apt_install() {
	local aptlog="$STATE_DIR/apt.log"
	log "installing $* (apt-get; log: $aptlog)"
	if [ -z "$APT_UPDATED" ]; then
		if ! as_root apt-get -q -o DPkg::Lock::Timeout=300 update >>"$aptlog" 2>&1; then
			tail -n 20 "$aptlog" >&2
			die "apt-get update failed"
		fi
		APT_UPDATED=1
	fi
	if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		-o DPkg::Lock::Timeout=300 --no-install-recommends "$@" >>"$aptlog" 2>&1; then
		tail -n 30 "$aptlog" >&2
		die "apt-get install $* failed"
	fi
}

log_tail() {
	local f
	for f in "$@"; do
		if [ -f "$f" ]; then
			printf -- '----- last lines of %s -----\n' "$f" >&2
			tail -n 40 "$f" >&2
		fi
	done
}

# ---------------------------------------------------------------------------
# Protocol-level checks. Each succeeds only when the service really answers.
# They use bash's /dev/tcp so that they work before any client is installed.

# pg_ready: a PostgreSQL server accepts connections on PG_PORT.
pg_ready() {
	if command -v pg_isready >/dev/null 2>&1; then
		pg_isready -q -h 127.0.0.1 -p "$PG_PORT" -t 2 >/dev/null 2>&1
		return
	fi
	# SSLRequest: the server answers 'S' or 'N'.
	local r
	r=$(timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$PG_PORT &&
		printf '\x00\x00\x00\x08\x04\xd2\x16\x2f' >&3 && head -c 1 <&3" 2>/dev/null) || return 1
	[ "$r" = S ] || [ "$r" = N ]
}

# redis_ready: PING answers +PONG.
redis_ready() {
	local r
	r=$(timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$REDIS_PORT &&
		printf 'PING\r\n' >&3 && head -n 1 <&3" 2>/dev/null) || return 1
	[ "${r%$'\r'}" = "+PONG" ]
}

# amqp_ready: the AMQP 0-9-1 protocol header is answered with a
# Connection.Start method frame (frame type 1 on channel 0, class 10 method 10).
amqp_ready() {
	local r
	r=$(timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$AMQP_PORT &&
		printf 'AMQP\x00\x00\x09\x01' >&3 && od -An -tx1 -N11 <&3" 2>/dev/null | tr -d ' \n') || return 1
	[ "${r:0:6}" = "010000" ] && [ "${r:14:8}" = "000a000a" ]
}

# kafka_ready: a Metadata v4 request (all topics) is answered and the answer
# lists at least one broker, i.e. the broker is registered and unfenced.
kafka_ready() { kafka_port_ready "$KAFKA_PORT" 1; }

# kafka_port_ready: as kafka_ready, for the broker on port $1, whose
# metadata must list at least $2 brokers.
kafka_port_ready() {
	local r port=$1 want=$2
	# size=20 | api_key=3 api_version=4 correlation_id=7 client_id="idemq" |
	# topics=null (-1) allow_auto_topic_creation=false
	r=$(timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port &&
		printf '\x00\x00\x00\x14\x00\x03\x00\x04\x00\x00\x00\x07\x00\x05idemq\xff\xff\xff\xff\x00' >&3 &&
		od -An -tx1 -N16 <&3" 2>/dev/null | tr -d ' \n') || return 1
	# bytes 4-7: correlation id, 8-11: throttle time, 12-15: number of brokers
	[ "${#r}" = 32 ] && [ "${r:8:8}" = "00000007" ] && [ $((16#${r:24:8})) -ge "$want" ]
}

# sqs_ready: an SQS ListQueues call (AWS JSON 1.0 protocol) returns HTTP 200.
sqs_ready() {
	local r
	r=$(timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$SQS_PORT &&
		printf 'POST / HTTP/1.1\r\nHost: 127.0.0.1:$SQS_PORT\r\nContent-Type: application/x-amz-json-1.0\r\nX-Amz-Target: AmazonSQS.ListQueues\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}' >&3 &&
		head -n 1 <&3" 2>/dev/null) || return 1
	[[ "$r" == "HTTP/1."?" 200"* ]]
}

# rc_port prints the port of a Redis Cluster node (redis-cluster-N).
rc_port() { echo $((REDIS_CLUSTER_BASE_PORT + ${1##*-})); }

# rc_node_ready: the node answers PING.
rc_node_ready() {
	local r
	r=$(timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$(rc_port "$1") &&
		printf 'PING\r\n' >&3 && head -n 1 <&3" 2>/dev/null) || return 1
	[ "${r%$'\r'}" = "+PONG" ]
}

# rs_port prints the port of a Sentinel-profile node (redis-sentinel-N,
# sentinel-N).
rs_port() {
	case "$1" in
	sentinel-*) echo $((SENTINEL_BASE_PORT + ${1##*-})) ;;
	*) echo $((REDIS_SENTINEL_BASE_PORT + ${1##*-})) ;;
	esac
}

# ping_ready: the server on port $1 answers PING.
ping_ready() {
	local r
	r=$(timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 &&
		printf 'PING\r\n' >&3 && head -n 1 <&3" 2>/dev/null) || return 1
	[ "${r%$'\r'}" = "+PONG" ]
}

ready() {
	case "$1" in
	postgres) pg_ready ;;
	redis) redis_ready ;;
	redis-cluster-[1-6]) rc_node_ready "$1" ;;
	redis-sentinel-[12] | sentinel-[1-3]) ping_ready "$(rs_port "$1")" ;;
	kafka-cluster-[1-3]) kafka_port_ready "$((KAFKA_CLUSTER_BASE_PORT + ${1##*-}))" 1 ;;
	rabbitmq) amqp_ready ;;
	kafka) kafka_ready ;;
	elasticmq) sqs_ready ;;
	esac
}

# ---------------------------------------------------------------------------
# Pid bookkeeping: $STATE_DIR/<svc>/pid holds the pid of the server process
# this script started. A pid counts only while that process is alive and its
# command line still looks like the service (pids get reused).

svc_dir() { printf '%s/%s' "$STATE_DIR" "$1"; }

cmd_pattern() {
	case "$1" in
	postgres) echo 'postgres' ;;
	redis | redis-cluster-[1-6] | redis-sentinel-[12] | sentinel-[1-3]) echo 'redis-server' ;;
	rabbitmq) echo 'beam' ;;
	kafka | kafka-cluster-[1-3]) echo 'kafka\.Kafka' ;;
	elasticmq) echo 'org\.elasticmq\.server\.Main' ;;
	esac
}

# our_pid prints the recorded pid if that process is alive and is the service.
our_pid() {
	local f pid
	f="$(svc_dir "$1")/pid"
	[ -s "$f" ] || return 1
	pid=$(cat "$f")
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -Eq "$(cmd_pattern "$1")" || return 1
	echo "$pid"
}

record_pid() { echo "$2" >"$(svc_dir "$1")/pid"; }
forget_pid() { rm -f "$(svc_dir "$1")/pid"; }

# wait_gone waits until pid has exited; after $2 seconds it sends SIGKILL.
wait_gone() {
	local pid=$1 limit=$2 start
	start=$(now)
	while kill -0 "$pid" 2>/dev/null; do
		if [ $(($(now) - start)) -ge "$limit" ]; then
			log "pid $pid still alive after ${limit}s; sending SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
			sleep 1
			return
		fi
		sleep 0.2
	done
}

# wait_ready polls the service's readiness check until it succeeds, the
# process this script started dies, or TIMEOUT runs out.
wait_ready() {
	local svc=$1 start pid
	shift
	start=$(now)
	while ! ready "$svc"; do
		pid=$(cat "$(svc_dir "$svc")/pid" 2>/dev/null || true)
		if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
			log_tail "$@"
			die "$svc: the server process (pid $pid) exited before it was ready"
		fi
		if [ $(($(now) - start)) -ge "$TIMEOUT" ]; then
			log_tail "$@"
			die "$svc: not ready after ${TIMEOUT}s (raise IDEMQ_SERVICES_TIMEOUT to wait longer)"
		fi
		sleep 0.5
	done
}

# Java services: jars come from Maven through a tiny pom, into the state dir.
ensure_java() {
	command -v java >/dev/null 2>&1 || apt_install openjdk-17-jre-headless
	command -v mvn >/dev/null 2>&1 || apt_install maven
}

# fetch_jars <svc>: copy the runtime classpath of testdata/services/<svc>/pom.xml
# into $STATE_DIR/<svc>/lib, once per pom content.
fetch_jars() {
	local svc=$1 dir sum
	dir=$(svc_dir "$svc")
	sum=$(sha256sum "$HERE/$svc/pom.xml" | cut -c1-16)
	if [ -f "$dir/lib/.complete" ] && [ "$(cat "$dir/lib/.complete")" = "$sum" ]; then
		return
	fi
	ensure_java
	log "$svc: fetching jars with mvn (log: $dir/mvn.log)"
	rm -rf "${dir:?}/lib.tmp"
	cp "$HERE/$svc/pom.xml" "$dir/pom.xml"
	if ! (cd "$dir" && mvn -B -q -f "$dir/pom.xml" dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory="$dir/lib.tmp") >"$dir/mvn.log" 2>&1; then
		log_tail "$dir/mvn.log"
		die "$svc: mvn dependency:copy-dependencies failed"
	fi
	echo "$sum" >"$dir/lib.tmp/.complete"
	rm -rf "${dir:?}/lib"
	mv "$dir/lib.tmp" "$dir/lib"
}

# launch_detached <svc> <logfile> <command...>: start a process in its own
# session so that it outlives this script, and record its pid.
launch_detached() {
	local svc=$1 logfile=$2
	shift 2
	# Without job control the child is no process-group leader, so setsid
	# execs in place and $! is the server's own pid.
	setsid nohup "$@" >>"$logfile" 2>&1 </dev/null 9>&- &
	record_pid "$svc" "$!"
}

# ---------------------------------------------------------------------------
# PostgreSQL: the Debian cluster "15 main", configured for loopback and trust.

PG_CONF_DIR=/etc/postgresql/$PG_VERSION/$PG_CLUSTER
PG_LOG=/var/log/postgresql/postgresql-$PG_VERSION-$PG_CLUSTER.log

pg_data_dir() {
	local d
	d=$(pg_conftool -s "$PG_VERSION" "$PG_CLUSTER" show data_directory 2>/dev/null || true)
	echo "${d:-/var/lib/postgresql/$PG_VERSION/$PG_CLUSTER}"
}

postgres_launch() {
	if [ ! -x "/usr/lib/postgresql/$PG_VERSION/bin/postgres" ] || ! command -v pg_ctlcluster >/dev/null 2>&1; then
		apt_install "postgresql-$PG_VERSION" postgresql-client-common
	fi
	if [ ! -d "$PG_CONF_DIR" ]; then
		as_root pg_createcluster "$PG_VERSION" "$PG_CLUSTER" >>"$(svc_dir postgres)/setup.log" 2>&1 ||
			die "postgres: pg_createcluster $PG_VERSION $PG_CLUSTER failed"
	fi
	as_root install -D -m 644 "$HERE/postgres/idemq.conf" "$PG_CONF_DIR/conf.d/idemq.conf"
	if ! cmp -s "$HERE/postgres/pg_hba.conf" "$PG_CONF_DIR/pg_hba.conf"; then
		[ -f "$PG_CONF_DIR/pg_hba.conf.orig" ] || as_root cp -p "$PG_CONF_DIR/pg_hba.conf" "$PG_CONF_DIR/pg_hba.conf.orig"
		as_root install -m 640 -o postgres -g postgres "$HERE/postgres/pg_hba.conf" "$PG_CONF_DIR/pg_hba.conf"
	fi
	as_root install -d -m 2775 -o postgres -g postgres /run/postgresql
	if ! as_root pg_ctlcluster "$PG_VERSION" "$PG_CLUSTER" start >>"$(svc_dir postgres)/setup.log" 2>&1 9>&-; then
		log_tail "$(svc_dir postgres)/setup.log" "$PG_LOG"
		die "postgres: pg_ctlcluster $PG_VERSION $PG_CLUSTER start failed"
	fi
	local pidfile
	pidfile="$(pg_data_dir)/postmaster.pid"
	if [ -s "$pidfile" ]; then
		record_pid postgres "$(head -n 1 "$pidfile")"
	fi
}

postgres_wait() { wait_ready postgres "$PG_LOG"; }

# postgres_after creates the test database if it is missing.
postgres_after() {
	command -v psql >/dev/null 2>&1 || return 0
	local have
	if ! have=$(psql -X -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -tAc \
		"SELECT 1 FROM pg_database WHERE datname = '$PG_DATABASE'" 2>&1); then
		log "postgres: warning: cannot query the server as user postgres: $have"
		return 0
	fi
	if [ "$have" != 1 ]; then
		psql -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -c "CREATE DATABASE $PG_DATABASE" ||
			die "postgres: CREATE DATABASE $PG_DATABASE failed"
		log "postgres: created database $PG_DATABASE"
	fi
}

postgres_stop() {
	local pid=$1
	as_root pg_ctlcluster "$PG_VERSION" "$PG_CLUSTER" stop -m fast >>"$(svc_dir postgres)/setup.log" 2>&1 ||
		kill -TERM "$pid" 2>/dev/null || true
	wait_gone "$pid" 60
}

# ---------------------------------------------------------------------------
# Redis: no persistence, data dir and log in the state dir.

redis_launch() {
	command -v redis-server >/dev/null 2>&1 || apt_install redis-server
	local dir
	dir=$(svc_dir redis)
	mkdir -p "$dir/data"
	rm -f "$dir/redis.pid"
	redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" \
		--save '' --appendonly no --dir "$dir/data" \
		--pidfile "$dir/redis.pid" --logfile "$dir/redis.log" 9>&- ||
		{
			log_tail "$dir/redis.log"
			die "redis: redis-server failed to start"
		}
	local i
	for i in $(seq 1 50); do
		[ -s "$dir/redis.pid" ] && break
		sleep 0.1
	done
	[ -s "$dir/redis.pid" ] && record_pid redis "$(cat "$dir/redis.pid")"
}

redis_wait() { wait_ready redis "$(svc_dir redis)/redis.log"; }
redis_after() { :; }

redis_stop() {
	kill -TERM "$1" 2>/dev/null || true
	wait_gone "$1" 30
}

# ---------------------------------------------------------------------------
# Redis Cluster: six redis-server nodes in cluster mode, no persistence; the
# cluster layout (nodes.conf) lives in each node's data dir, so a node that
# restarts rejoins (as a replica, if its replica was promoted meanwhile).
# cluster-node-timeout is 2 s, so a master that stops fails over quickly.
# The profile "redis-cluster" starts all six and creates the cluster once.

rc_launch() {
	local svc=$1 dir port
	command -v redis-server >/dev/null 2>&1 || apt_install redis-server
	dir=$(svc_dir "$svc")
	port=$(rc_port "$svc")
	mkdir -p "$dir/data"
	rm -f "$dir/redis.pid"
	redis-server --daemonize yes --bind 127.0.0.1 --port "$port" \
		--cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
		--save '' --appendonly no --dir "$dir/data" \
		--pidfile "$dir/redis.pid" --logfile "$dir/redis.log" 9>&- ||
		{
			log_tail "$dir/redis.log"
			die "$svc: redis-server failed to start"
		}
	local i
	for i in $(seq 1 50); do
		[ -s "$dir/redis.pid" ] && break
		sleep 0.1
	done
	[ -s "$dir/redis.pid" ] && record_pid "$svc" "$(cat "$dir/redis.pid")"
}

rc_wait() { wait_ready "$1" "$(svc_dir "$1")/redis.log"; }
rc_after() { :; }
rc_stop() { redis_stop "$1"; }

# ---------------------------------------------------------------------------
# Kafka cluster: three KRaft nodes, each a broker and a controller, sharing
# the single node's jars and one cluster id (formatted once per node).

kc_launch() {
	local svc=$1 n dir voters="" i cluster_id
	n=${svc##*-}
	fetch_jars kafka
	dir=$(svc_dir "$svc")
	mkdir -p "$dir/data"
	for i in 1 2 3; do
		voters+="${voters:+,}$i@127.0.0.1:$((KAFKA_CLUSTER_CONTROLLER_BASE_PORT + i))"
	done
	sed -e "s|@NODE_ID@|$n|g" -e "s|@DATA_DIR@|$dir/data|g" \
		-e "s|@PORT@|$((KAFKA_CLUSTER_BASE_PORT + n))|g" \
		-e "s|@CONTROLLER_PORT@|$((KAFKA_CLUSTER_CONTROLLER_BASE_PORT + n))|g" \
		-e "s|@VOTERS@|$voters|g" "$HERE/kafka/cluster.properties" >"$dir/server.properties"
	local java_opts=(-Dlog4j2.configurationFile="$HERE/kafka/log4j2.xml" -cp "$(svc_dir kafka)/lib/*")
	if [ ! -f "$dir/data/meta.properties" ]; then
		if [ ! -s "$STATE_DIR/kafka-cluster.id" ]; then
			cluster_id=$(java "${java_opts[@]}" kafka.tools.StorageTool random-uuid 2>>"$dir/format.log" |
				grep -E '^[A-Za-z0-9_-]{22}$' | tail -n 1) || true
			[ -n "$cluster_id" ] || die "$svc: StorageTool random-uuid printed no cluster id"
			echo "$cluster_id" >"$STATE_DIR/kafka-cluster.id"
		fi
		if ! java "${java_opts[@]}" kafka.tools.StorageTool format -t "$(cat "$STATE_DIR/kafka-cluster.id")" \
			-c "$dir/server.properties" >>"$dir/format.log" 2>&1; then
			log_tail "$dir/format.log"
			die "$svc: formatting the storage failed"
		fi
	fi
	# shellcheck disable=SC2086 # KAFKA_CLUSTER_HEAP holds several options
	launch_detached "$svc" "$dir/kafka.log" java $KAFKA_CLUSTER_HEAP -server \
		-XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
		"${java_opts[@]}" kafka.Kafka "$dir/server.properties"
}

kc_wait() { wait_ready "$1" "$(svc_dir "$1")/kafka.log"; }
kc_after() { :; }
kc_stop() { kafka_stop "$1"; }

# kc_form waits until a running node's metadata lists every running node.
kc_form() {
	local start node up=0 first=
	for node in "${KAFKA_CLUSTER_NODES[@]}"; do
		if ready "$node"; then
			up=$((up + 1))
			first=${first:-$node}
		fi
	done
	[ -n "$first" ] || return 0
	start=$(now)
	until kafka_port_ready "$((KAFKA_CLUSTER_BASE_PORT + ${first##*-}))" "$up"; do
		if [ $(($(now) - start)) -ge "$TIMEOUT" ]; then
			die "kafka-cluster: $first does not list $up brokers after ${TIMEOUT}s"
		fi
		sleep 0.5
	done
	log "kafka-cluster: $up of 3 brokers registered"
}

# kc_addrs prints the cluster's broker addresses, comma-separated.
kc_addrs() {
	local i out=()
	for i in 1 2 3; do
		out+=("127.0.0.1:$((KAFKA_CLUSTER_BASE_PORT + i))")
	done
	(IFS=,; echo "${out[*]}")
}

# ---------------------------------------------------------------------------
# Redis with Sentinel: two data nodes (a primary and its replica, no
# persistence) and three Sentinels that fail over within about 3 s
# (down-after 1 s). A data node that starts while the Sentinels know the
# primary joins it as a replica; otherwise redis-sentinel-1 is the primary.

rs_launch() {
	local svc=$1 dir port master=() args=()
	command -v redis-server >/dev/null 2>&1 || apt_install redis-server
	dir=$(svc_dir "$svc")
	port=$(rs_port "$svc")
	mkdir -p "$dir/data"
	rm -f "$dir/redis.pid"
	mapfile -t master < <(redis-cli -p "$(rs_port sentinel-1)" sentinel get-master-addr-by-name "$SENTINEL_MASTER" 2>/dev/null || true)
	if [ "${#master[@]}" = 2 ] && [ -n "${master[1]}" ]; then
		[ "${master[1]}" != "$port" ] && args=(--replicaof "${master[0]}" "${master[1]}")
	elif [ "$svc" != redis-sentinel-1 ]; then
		args=(--replicaof 127.0.0.1 "$(rs_port redis-sentinel-1)")
	fi
	redis-server --daemonize yes --bind 127.0.0.1 --port "$port" "${args[@]}" \
		--save '' --appendonly no --dir "$dir/data" \
		--pidfile "$dir/redis.pid" --logfile "$dir/redis.log" 9>&- ||
		{
			log_tail "$dir/redis.log"
			die "$svc: redis-server failed to start"
		}
	rs_record "$svc"
}

# rs_record records the pid that redis-server wrote.
rs_record() {
	local dir i
	dir=$(svc_dir "$1")
	for i in $(seq 1 50); do
		[ -s "$dir/redis.pid" ] && break
		sleep 0.1
	done
	[ -s "$dir/redis.pid" ] && record_pid "$1" "$(cat "$dir/redis.pid")"
}

rs_wait() { wait_ready "$1" "$(svc_dir "$1")/redis.log"; }
rs_after() { :; }
rs_stop() { redis_stop "$1"; }

# st_launch starts a Sentinel. Its config file lives in its state dir, and
# the Sentinel rewrites it (the current primary, the other Sentinels).
st_launch() {
	local svc=$1 dir port
	command -v redis-server >/dev/null 2>&1 || apt_install redis-server
	dir=$(svc_dir "$svc")
	port=$(rs_port "$svc")
	mkdir -p "$dir"
	rm -f "$dir/redis.pid"
	if [ ! -s "$dir/sentinel.conf" ]; then
		printf '%s\n' "port $port" "bind 127.0.0.1" "dir $dir" \
			"sentinel monitor $SENTINEL_MASTER 127.0.0.1 $(rs_port redis-sentinel-1) 2" \
			"sentinel down-after-milliseconds $SENTINEL_MASTER 1000" \
			"sentinel failover-timeout $SENTINEL_MASTER 5000" \
			"sentinel parallel-syncs $SENTINEL_MASTER 1" >"$dir/sentinel.conf"
	fi
	redis-server "$dir/sentinel.conf" --sentinel --daemonize yes \
		--pidfile "$dir/redis.pid" --logfile "$dir/redis.log" 9>&- ||
		{
			log_tail "$dir/redis.log"
			die "$svc: redis-server --sentinel failed to start"
		}
	rs_record "$svc"
}

st_wait() { wait_ready "$1" "$(svc_dir "$1")/redis.log"; }
st_after() { :; }
st_stop() { redis_stop "$1"; }

# rs_field prints a field of SENTINEL MASTER as sentinel $1 sees it.
rs_field() {
	redis-cli -p "$(rs_port "$1")" sentinel master "$SENTINEL_MASTER" 2>/dev/null |
		awk -v f="$2" 'prev == f {print; exit} {prev = $0}'
}

# rs_form waits until the Sentinels that run agree on a primary with a
# replica and know each other.
rs_form() {
	local start node
	start=$(now)
	for node in sentinel-1 sentinel-2 sentinel-3; do
		ready "$node" || continue
		while [ "$(rs_field "$node" num-slaves)" != 1 ] || [ "$(rs_field "$node" num-other-sentinels)" != 2 ] ||
			[ "$(rs_field "$node" flags)" != master ]; do
			if [ $(($(now) - start)) -ge "$TIMEOUT" ]; then
				die "redis-sentinel: $node does not see a primary with a replica and two other Sentinels after ${TIMEOUT}s"
			fi
			sleep 0.5
		done
	done
	log "redis-sentinel: the Sentinels see primary $(rs_field sentinel-1 ip):$(rs_field sentinel-1 port) with its replica"
}

# rc_info prints a field of CLUSTER INFO as one node sees it.
rc_info() {
	redis-cli -p "$(rc_port "$1")" cluster info 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"
}

# rc_form creates the cluster when no node knows the others yet, then waits
# until every node reports cluster_state:ok.
rc_form() {
	local node addrs=() start
	if [ "$(rc_info redis-cluster-1 cluster_known_nodes)" != 6 ]; then
		for node in "${REDIS_CLUSTER_NODES[@]}"; do
			addrs+=("127.0.0.1:$(rc_port "$node")")
		done
		log "redis-cluster: creating the cluster (3 masters, 3 replicas)"
		redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$(svc_dir redis-cluster-1)/create.log" 2>&1 ||
			{
				log_tail "$(svc_dir redis-cluster-1)/create.log"
				die "redis-cluster: redis-cli --cluster create failed"
			}
	fi
	start=$(now)
	for node in "${REDIS_CLUSTER_NODES[@]}"; do
		while [ "$(rc_info "$node" cluster_state)" != ok ]; do
			if [ $(($(now) - start)) -ge "$TIMEOUT" ]; then
				die "redis-cluster: $node not in state ok after ${TIMEOUT}s"
			fi
			sleep 0.5
		done
	done
	log "redis-cluster: cluster_state ok on all six nodes"
}

# ---------------------------------------------------------------------------
# RabbitMQ: Debian's package, started by hand (no init system), loopback only.

rabbit_node() { echo "rabbit@$(hostname -s)"; }
rabbit_pidfile() { echo "/var/lib/rabbitmq/mnesia/$(rabbit_node).pid"; }
rabbit_log() { echo "/var/log/rabbitmq/$(rabbit_node).log"; }

# The Erlang node name uses the host name, which must resolve.
ensure_hostname_resolves() {
	local h s
	h=$(hostname)
	s=$(hostname -s)
	if ! getent hosts "$s" >/dev/null 2>&1 || ! getent hosts "$h" >/dev/null 2>&1; then
		log "rabbitmq: adding '$h' to /etc/hosts (the Erlang node name needs it)"
		if [ "$h" = "$s" ]; then
			echo "127.0.0.1 $h" | as_root tee -a /etc/hosts >/dev/null
		else
			echo "127.0.0.1 $h $s" | as_root tee -a /etc/hosts >/dev/null
		fi
	fi
}

rabbitmq_launch() {
	ensure_hostname_resolves
	command -v rabbitmq-server >/dev/null 2>&1 || apt_install rabbitmq-server
	local f
	for f in rabbitmq.conf rabbitmq-env.conf advanced.config; do
		if ! cmp -s "$HERE/rabbitmq/$f" "/etc/rabbitmq/$f"; then
			as_root install -D -m 644 "$HERE/rabbitmq/$f" "/etc/rabbitmq/$f"
		fi
	done
	local dir
	dir=$(svc_dir rabbitmq)
	as_root rm -f "$(rabbit_pidfile)"
	if ! as_root rabbitmq-server -detached >>"$dir/rabbitmq.out" 2>&1 9>&-; then
		log_tail "$dir/rabbitmq.out" "$(rabbit_log)"
		die "rabbitmq: rabbitmq-server -detached failed"
	fi
}

rabbitmq_wait() {
	local dir
	dir=$(svc_dir rabbitmq)
	if ! as_root rabbitmqctl wait --timeout "$TIMEOUT" "$(rabbit_pidfile)" >>"$dir/rabbitmq.out" 2>&1; then
		log_tail "$dir/rabbitmq.out" "$(rabbit_log)"
		die "rabbitmq: rabbitmqctl wait failed"
	fi
	[ -s "$(rabbit_pidfile)" ] && record_pid rabbitmq "$(cat "$(rabbit_pidfile)")"
	wait_ready rabbitmq "$dir/rabbitmq.out" "$(rabbit_log)"
}

# rabbitmq_after enables every stable feature flag (quorum queues among them)
# on a node this script started; fresh nodes have them all already.
rabbitmq_after() {
	local pid dir
	pid=$(our_pid rabbitmq) || return 0
	dir=$(svc_dir rabbitmq)
	[ "$(cat "$dir/flags-enabled" 2>/dev/null)" = "$pid" ] && return 0
	if as_root rabbitmqctl -q enable_feature_flag all >>"$dir/rabbitmq.out" 2>&1; then
		echo "$pid" >"$dir/flags-enabled"
	else
		log "rabbitmq: warning: enable_feature_flag all failed"
	fi
}

rabbitmq_stop() {
	as_root rabbitmqctl -q shutdown >>"$(svc_dir rabbitmq)/rabbitmq.out" 2>&1 ||
		kill -TERM "$1" 2>/dev/null || true
	wait_gone "$1" 60
}

# ---------------------------------------------------------------------------
# Apache Kafka: one KRaft node (broker + controller), jars from Maven.

kafka_launch() {
	fetch_jars kafka
	local dir
	dir=$(svc_dir kafka)
	mkdir -p "$dir/data"
	sed -e "s|@DATA_DIR@|$dir/data|g" -e "s|@PORT@|$KAFKA_PORT|g" \
		-e "s|@CONTROLLER_PORT@|$KAFKA_CONTROLLER_PORT|g" \
		"$HERE/kafka/server.properties" >"$dir/server.properties"
	local java_opts=(-Dlog4j2.configurationFile="$HERE/kafka/log4j2.xml" -cp "$dir/lib/*")
	if [ ! -f "$dir/data/meta.properties" ]; then
		local cluster_id
		# The tool may log to stdout too; the id is the line of 22 base64url characters.
		cluster_id=$(java "${java_opts[@]}" kafka.tools.StorageTool random-uuid 2>>"$dir/format.log" |
			grep -E '^[A-Za-z0-9_-]{22}$' | tail -n 1) || true
		if [ -z "$cluster_id" ]; then
			log_tail "$dir/format.log"
			die "kafka: StorageTool random-uuid printed no cluster id"
		fi
		if ! java "${java_opts[@]}" kafka.tools.StorageTool format -t "$cluster_id" \
			-c "$dir/server.properties" >>"$dir/format.log" 2>&1; then
			log_tail "$dir/format.log"
			die "kafka: formatting the storage failed"
		fi
		log "kafka: formatted storage (cluster id $cluster_id)"
	fi
	# shellcheck disable=SC2086 # KAFKA_HEAP holds several options
	launch_detached kafka "$dir/kafka.log" java $KAFKA_HEAP -server \
		-XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
		-XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
		"${java_opts[@]}" kafka.Kafka "$dir/server.properties"
}

kafka_wait() { wait_ready kafka "$(svc_dir kafka)/kafka.log"; }
kafka_after() { :; }

kafka_stop() {
	kill -TERM "$1" 2>/dev/null || true
	wait_gone "$1" 60
}

# ---------------------------------------------------------------------------
# ElasticMQ: SQS-compatible server, jars from Maven, in-memory queues.

elasticmq_launch() {
	fetch_jars elasticmq
	local dir
	dir=$(svc_dir elasticmq)
	# shellcheck disable=SC2086 # ELASTICMQ_HEAP holds several options
	launch_detached elasticmq "$dir/elasticmq.log" java $ELASTICMQ_HEAP \
		-XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
		-Dconfig.file="$HERE/elasticmq/elasticmq.conf" \
		-cp "$dir/lib/*" org.elasticmq.server.Main
}

elasticmq_wait() { wait_ready elasticmq "$(svc_dir elasticmq)/elasticmq.log"; }
elasticmq_after() { :; }

elasticmq_stop() {
	kill -TERM "$1" 2>/dev/null || true
	wait_gone "$1" 30
}

# ---------------------------------------------------------------------------
# Commands

# rc_addrs prints the Redis Cluster nodes' addresses, comma-separated.
rc_addrs() {
	local node out=()
	for node in "${REDIS_CLUSTER_NODES[@]}"; do
		out+=("127.0.0.1:$(rc_port "$node")")
	done
	(IFS=,; echo "${out[*]}")
}

env_lines() {
	cat <<EOF
export TEST_DATABASE_URL='postgres://postgres@127.0.0.1:$PG_PORT/$PG_DATABASE?sslmode=disable'
export TEST_REDIS_URL='redis://127.0.0.1:$REDIS_PORT/0'
export TEST_AMQP_URL='amqp://guest:guest@127.0.0.1:$AMQP_PORT/'
export TEST_KAFKA_BROKERS='127.0.0.1:$KAFKA_PORT'
export TEST_SQS_ENDPOINT='http://127.0.0.1:$SQS_PORT'
export TEST_REDIS_CLUSTER_ADDRS='$(rc_addrs)'
export TEST_KAFKA_CLUSTER_BROKERS='$(kc_addrs)'
export TEST_REDIS_SENTINEL_ADDRS='127.0.0.1:$(rs_port sentinel-1),127.0.0.1:$(rs_port sentinel-2),127.0.0.1:$(rs_port sentinel-3)'
EOF
}

write_env() {
	env_lines >"$STATE_DIR/env.tmp"
	mv "$STATE_DIR/env.tmp" "$STATE_DIR/env"
}

# svc_fn names a service's function: <svc>_<what>, rc_<what> for a Redis
# Cluster node. The functions get the service name as their last argument.
svc_fn() {
	case "$1" in
	redis-cluster-[1-6]) echo "rc_$2" ;;
	redis-sentinel-[12]) echo "rs_$2" ;;
	kafka-cluster-[1-3]) echo "kc_$2" ;;
	sentinel-[1-3]) echo "st_$2" ;;
	*) echo "${1}_$2" ;;
	esac
}

cmd_up() {
	local svc pending=() t0 start
	t0=$(now)
	for svc in "$@"; do
		mkdir -p "$(svc_dir "$svc")"
		if ready "$svc"; then
			if our_pid "$svc" >/dev/null; then
				log "$svc: running (pid $(our_pid "$svc"))"
			else
				log "$svc: something already answers on its port; using it"
			fi
			"$(svc_fn "$svc" after)" "$svc"
			continue
		fi
		if our_pid "$svc" >/dev/null; then
			log "$svc: started earlier (pid $(our_pid "$svc")), waiting for it"
		else
			forget_pid "$svc"
			log "$svc: starting"
			"$(svc_fn "$svc" launch)" "$svc"
		fi
		pending+=("$svc")
	done
	for svc in "${pending[@]}"; do
		start=$(now)
		"$(svc_fn "$svc" wait)" "$svc"
		"$(svc_fn "$svc" after)" "$svc"
		log "$svc: ready (pid $(our_pid "$svc" || echo '?'); waited $(($(now) - start))s)"
	done
	write_env
	log "up: $* ready in $(($(now) - t0))s; env: $STATE_DIR/env"
}

cmd_stop() {
	local svc pid
	for svc in "$@"; do
		if pid=$(our_pid "$svc"); then
			log "$svc: stopping pid $pid"
			"$(svc_fn "$svc" stop)" "$pid" "$svc"
			forget_pid "$svc"
			log "$svc: stopped"
		elif ready "$svc"; then
			die "$svc: answers on its port but was not started by this script; not stopping it"
		else
			forget_pid "$svc"
			log "$svc: not running"
		fi
	done
}

cmd_kill() {
	local svc pid
	for svc in "$@"; do
		if pid=$(our_pid "$svc"); then
			log "$svc: SIGKILL to pid $pid"
			kill -KILL "$pid" 2>/dev/null || true
			wait_gone "$pid" 10
			forget_pid "$svc"
		else
			die "$svc: not started by this script; not killing it"
		fi
	done
}

cmd_down() {
	local svc pid i
	for ((i = $# ; i > 0 ; i--)); do
		svc=${!i}
		if pid=$(our_pid "$svc"); then
			log "$svc: stopping pid $pid"
			"$(svc_fn "$svc" stop)" "$pid" "$svc"
			log "$svc: stopped"
		elif ready "$svc"; then
			log "$svc: not started by this script; leaving it running"
		fi
		forget_pid "$svc"
	done
}

# cmd_browser installs Chromium, which the browser tests drive headless,
# when none is on PATH. It is a program, not a service: nothing runs.
cmd_browser() {
	local bin
	for bin in chromium chromium-browser; do
		if command -v "$bin" >/dev/null 2>&1; then
			log "browser: $(command -v "$bin") ($("$bin" --version 2>/dev/null || echo 'version unknown'))"
			return
		fi
	done
	apt_install chromium
	log "browser: $(command -v chromium) ($(chromium --version 2>/dev/null || echo 'version unknown'))"
}

cmd_status() {
	local svc rc=0
	for svc in "$@"; do
		if ready "$svc"; then
			if our_pid "$svc" >/dev/null; then
				echo "$svc: up (pid $(our_pid "$svc"), started by services.sh)"
			else
				echo "$svc: up (not started by services.sh)"
			fi
		else
			echo "$svc: down"
			rc=1
		fi
	done
	return $rc
}

check_services() {
	local svc known
	for svc in "$@"; do
		for known in "${ALL_SERVICES[@]}" "${REDIS_CLUSTER_NODES[@]}" "${REDIS_SENTINEL_NODES[@]}" "${KAFKA_CLUSTER_NODES[@]}"; do
			[ "$svc" = "$known" ] && continue 2
		done
		die "unknown service '$svc' (known: ${ALL_SERVICES[*]} redis-cluster ${REDIS_CLUSTER_NODES[*]} redis-sentinel ${REDIS_SENTINEL_NODES[*]} kafka-cluster ${KAFKA_CLUSTER_NODES[*]})"
	done
}

usage() {
	sed -n '11,34p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

main() {
	[ $# -ge 1 ] || usage
	local cmd=$1
	shift
	case "$cmd" in
	env)
		mkdir -p "$STATE_DIR"
		write_env
		env_lines
		return
		;;
	browser)
		mkdir -p "$STATE_DIR"
		cmd_browser
		return
		;;
	up | down | status) [ $# -gt 0 ] || set -- "${ALL_SERVICES[@]}" ;;
	start | stop | restart | kill) [ $# -gt 0 ] || usage ;;
	-h | --help | help) usage ;;
	*)
		log "unknown command '$cmd'"
		usage
		;;
	esac
	# The redis-cluster profile stands for its six nodes; starting any node
	# ends with the cluster formed and in state ok.
	local args=() svc cluster= sentinel= kcluster=
	for svc in "$@"; do
		case "$svc" in
		kafka-cluster)
			args+=("${KAFKA_CLUSTER_NODES[@]}")
			kcluster=1
			;;
		kafka-cluster-[1-3])
			args+=("$svc")
			kcluster=1
			;;
		redis-sentinel)
			args+=("${REDIS_SENTINEL_NODES[@]}")
			sentinel=1
			;;
		redis-sentinel-[12] | sentinel-[1-3])
			args+=("$svc")
			sentinel=1
			;;
		redis-cluster)
			args+=("${REDIS_CLUSTER_NODES[@]}")
			cluster=1
			;;
		redis-cluster-[1-6])
			args+=("$svc")
			cluster=1
			;;
		*) args+=("$svc") ;;
		esac
	done
	set -- "${args[@]}"
	check_services "$@"
	mkdir -p "$STATE_DIR"
	if [ "$cmd" = status ]; then
		cmd_status "$@"
		return
	fi
	# One invocation at a time: parallel test packages may restart services.
	exec 9>"$STATE_DIR/.lock"
	if ! flock -w 900 9; then
		die "another services.sh holds $STATE_DIR/.lock"
	fi
	case "$cmd" in
	up | start) cmd_up "$@" ;;
	down) cmd_down "$@" ;;
	stop) cmd_stop "$@" ;;
	kill) cmd_kill "$@" ;;
	restart)
		cmd_stop "$@"
		cmd_up "$@"
		;;
	esac
	if [ -n "$cluster" ] && { [ "$cmd" = up ] || [ "$cmd" = start ] || [ "$cmd" = restart ]; }; then
		rc_form
	fi
	if [ -n "$sentinel" ] && { [ "$cmd" = up ] || [ "$cmd" = start ] || [ "$cmd" = restart ]; }; then
		rs_form
	fi
	if [ -n "$kcluster" ] && { [ "$cmd" = up ] || [ "$cmd" = start ] || [ "$cmd" = restart ]; }; then
		kc_form
	fi
}

main "$@"
