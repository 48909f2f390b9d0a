# idemq — make help lists the targets.
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help

GO       ?= go
SERVICES := bash testdata/services/services.sh
# Service addresses for the tests: the variables already set win, the rest
# come from the services script.
WITH_ENV := set -a; eval "$$($(SERVICES) env)"; set +a;
TEST_FLAGS ?= -p 1 -count=1 -timeout 30m
# make test runs the packages whose tests restart a shared service after the
# rest, which run two at a time. Then two jobs run side by side: the packages
# that restart a broker (amqpsource and kafkasource, each restarting only its
# own broker, which the other does not use) with sqssource (which restarts
# only an ElasticMQ of its own), three at a time; and the packages that
# restart Redis, one at a time, with internal/testenv's Redis restart test
# (its other tests run with the rest, since they use the brokers). The core
# packages (RACE_CORE, what make test-race-core covers) run under the race
# detector, once: make test runs no second, plain pass of them. The
# cmd/internal module (benchmarks, chaos suite, checkout worker: a module of its
# own, so that ./... here does not reach it) runs its tests after the
# module's own, before the restarters.
RESTART_BROKERS := ./sources/amqpsource ./sources/kafkasource
BESIDE_BROKERS  := ./sources/sqssource
RESTART_REDIS   := ./dedup/redisdedup ./internal/leasepath
REDIS_RESTART_TESTS := ^TestRestartRedisSmoke$$
RACE_CORE       := ./consumer/... ./dedup/... ./internal/leasepath ./dedup/memdedup ./consumer/memsource
# The longest packages start first, so that two at a time do not end with
# one of them running alone.
SLOW_FIRST      := ./dedup/sqldedup ./consumer ./cmd/idemq-demo/internal/demo ./sources/sqssource/sqsdlq \
	./sinks/outbox/kafkaoutbox ./consumer/otelidemq ./sinks/outbox/internal/chain ./cmd/idemq ./sinks/outbox/amqpoutbox
TEST_RUN        ?= -count=1 -timeout 30m
# Filters of go list's output (import paths, order kept): only the packages
# the patterns match, or all but those.
only   = grep -x -F -e '' $$($(GO) list $(1) | sed 's/^/-e /')
except = grep -v -x -F -e '' $$($(GO) list $(1) | sed 's/^/-e /')
# golangci-lint with .golangci.yml, built from source by go run (the first
# run takes a few minutes), so make lint needs no install.
GOLANGCI_LINT ?= $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: demo
demo: ## Run the checkout worker on embedded defaults (in-process Kafka, SQLite) under chaos, its events through the outbox to a notifier, and print the proof of both hops.
	$(GO) run ./cmd/idemq-demo

.PHONY: test
test: services ## Start the real services, then run every test (the core under the race detector, those that restart a service last).
	$(WITH_ENV) $(GO) test -race -p 2 $(TEST_RUN) $$($(GO) list $(SLOW_FIRST) $(RACE_CORE) | $(call only,$(RACE_CORE)) | $(call except,$(RESTART_BROKERS) $(RESTART_REDIS)))
	$(WITH_ENV) $(GO) test -p 2 $(TEST_RUN) -skip '$(REDIS_RESTART_TESTS)' $$($(GO) list $(SLOW_FIRST) ./... | $(call except,$(RACE_CORE) $(RESTART_BROKERS) $(BESIDE_BROKERS) $(RESTART_REDIS)))
	$(WITH_ENV) $(GO) -C cmd/internal test -p 2 $(TEST_RUN) ./...
	$(WITH_ENV) redis_log=$$(mktemp); \
	( $(GO) test -race -p 1 $(TEST_RUN) $(RESTART_REDIS) && \
	  $(GO) test $(TEST_RUN) -run '$(REDIS_RESTART_TESTS)' ./internal/testenv ) >"$$redis_log" 2>&1 & redis=$$!; \
	$(GO) test -p 3 -parallel 4 $(TEST_RUN) $(RESTART_BROKERS) $(BESIDE_BROKERS); brokers=$$?; \
	wait $$redis; redis_rc=$$?; echo "Redis restarters:"; cat "$$redis_log"; rm -f "$$redis_log"; \
	[ $$brokers -eq 0 ] && [ $$redis_rc -eq 0 ]

.PHONY: test-race
test-race: services ## Like test, with the race detector.
	$(WITH_ENV) $(GO) test -race $(TEST_FLAGS) ./...
	$(WITH_ENV) $(GO) -C cmd/internal test -race $(TEST_FLAGS) ./...

.PHONY: test-race-core
test-race-core: services ## The race detector over the runner (its lease path with Redis too), the stores and the in-memory broker.
	$(WITH_ENV) $(GO) test -race $(TEST_FLAGS) $(RACE_CORE)

.PHONY: test-chain-long
test-chain-long: services ## The outbox chain test (Kafka → A → relay → RabbitMQ → B → webhook) with 2000 orders and more SIGKILLs.
	$(WITH_ENV) IDEMQ_CHAIN_LONG=1 $(GO) test -count=1 -timeout 30m -run '^TestChain$$' -v ./sinks/outbox/internal/chain

.PHONY: test-batch-kill-long
test-batch-kill-long: services ## The batch outbox kill test (RabbitMQ → TransactionalBatch + outbox.Publish per message → relay → downstream) with 3000 messages and 30 worker and 30 relay SIGKILLs.
	$(WITH_ENV) IDEMQ_BATCH_KILL_LONG=1 $(GO) test -count=1 -timeout 30m -run '^TestBatchHandlerPublishesUnderKills$$' -v ./sinks/outbox/amqpoutbox

# CHAOS=short (a few minutes, run by CI) or CHAOS=long (over 1,000 SIGKILLs);
# both fire the node faults. CHAOS_FLAGS=-node-faults=false turns them off.
CHAOS ?= short
CHAOS_FLAGS ?=

.PHONY: chaos
chaos: services ## SIGKILL workers and PostgreSQL backends on Kafka, SQS, RabbitMQ and the Redis lease path; kill a Kafka node and a Redis Cluster master, restart RabbitMQ and PostgreSQL; prove one effect per key, none missing, poison dead-lettered (CHAOS=short|long, CHAOS_FLAGS).
	$(WITH_ENV) CHAOS=$(CHAOS) $(GO) -C cmd/internal run ./chaos $(CHAOS_FLAGS)

# test-short points every service at a closed loopback port (and the
# services' state directory nowhere), so a test that needs a service and does
# not skip under -short fails here even on a machine where the services run.
NO_SERVICES := TEST_DATABASE_URL='postgres://127.0.0.1:1/none?sslmode=disable' \
	TEST_REDIS_URL=redis://127.0.0.1:1/0 TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:1/ \
	TEST_KAFKA_BROKERS=127.0.0.1:1 TEST_SQS_ENDPOINT=http://127.0.0.1:1 \
	TEST_REDIS_CLUSTER_ADDRS=127.0.0.1:1 TEST_REDIS_SENTINEL_ADDRS=127.0.0.1:1 \
	TEST_KAFKA_CLUSTER_BROKERS=127.0.0.1:1 IDEMQ_SERVICES_DIR=/nonexistent

.PHONY: test-short
test-short: ## Unit tests only: no service needed (and none used: every service address is a closed port).
	$(NO_SERVICES) $(GO) test -short -count=1 ./...
	$(NO_SERVICES) $(GO) -C cmd/internal test -short -count=1 ./...

.PHONY: bench
bench: services ## PostgreSQL path vs hand-written careful and set-based workers: msg/s, ratios, round trips, statements, XIDs per message (BENCH_FLAGS=-sweep for batch sizes).
	$(WITH_ENV) $(GO) -C cmd/internal run ./bench/core $(BENCH_FLAGS)

.PHONY: bench-http
bench-http: services ## POST /charges with Idempotency-Key: httpsource on pgdedup vs a careful hand-written net/http + pgx handler at 1/16/64 clients: req/s, p50/p99, ratios, two alternating rounds (BENCH_FLAGS=-duration 10s ...).
	$(WITH_ENV) $(GO) -C cmd/internal run ./bench/http $(BENCH_FLAGS)

.PHONY: bench-retention
bench-retention: ## pgdedup's janitor at full speed on a 10 M-row table: claims/s idle vs while it deletes (ratio), its rows/s, p99 claim latency, table and index size after 3 cycles (BENCH_FLAGS=-rows N ...).
	$(SERVICES) up postgres
	$(WITH_ENV) $(GO) -C cmd/internal run ./bench/retention $(BENCH_FLAGS)

# SCALE=short (2 M records, 25 s runs, under 4 minutes: run by CI) or SCALE=long
# (80 M records, 5 min runs; over an hour and about 25 GB of disk). Both run a
# PostgreSQL cluster of their own (IDEMQ_BENCH_PG_DSN selects a server
# instead) and a redis-server of their own.
SCALE ?= long

.PHONY: bench-scale
bench-scale: ## pgdedup at the documented load (80 M records, 8 days): claims/s, p50/p99, WAL/claim, bytes/record, each day's retention and dead tuples, empty vs partitioned (empty and filled) vs DELETE janitor, goals checked; Redis memory per key (SCALE=short|long, BENCH_FLAGS).
	$(GO) -C cmd/internal run ./bench/scale -mode $(SCALE) $(BENCH_FLAGS)

# Native fuzz targets, as package:Target; make fuzz runs each for FUZZTIME.
FUZZ_TARGETS := \
	./consumer:FuzzValidKey ./consumer:FuzzPrepare ./consumer:FuzzDecodeJSON \
	./sources/amqpsource:FuzzHeaderReaders ./sources/amqpsource:FuzzToMessage \
	./sources/sqssource:FuzzMessage ./sources/sqssource:FuzzDeadLetterAttributes ./sources/sqssource:FuzzParseMaxReceiveCount \
	./sources/kafkasource:FuzzKeyFunc ./sources/kafkasource:FuzzDeadLetterCopy \
	./dedup/redisdedup:FuzzRedisKey ./dedup/redisdedup:FuzzRedisKeyPairs \
	./dedup/internal/sqlstore:FuzzRender ./internal/redact:FuzzString ./internal/metatext:FuzzClean
FUZZTIME ?= 10s
# Minimizing every new input of a large corpus entry can take the whole
# FUZZTIME; a bounded number of tries keeps the fuzzer fuzzing.
FUZZMINIMIZE ?= 200x
FUZZFLAGS ?=
# Targets fuzzed at a time, sharing the cores; each still fuzzes FUZZTIME.
FUZZJOBS ?= 2

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME (default 10s) each, FUZZJOBS (default 2) at a time; crashers land in <pkg>/testdata/fuzz.
	GO=$(GO) FUZZTIME=$(FUZZTIME) FUZZMINIMIZE=$(FUZZMINIMIZE) FUZZJOBS=$(FUZZJOBS) FUZZFLAGS='$(FUZZFLAGS)' bash .ci/fuzz $(FUZZ_TARGETS)

.PHONY: lint
lint: ## gofmt, go vet, golangci-lint (.golangci.yml: staticcheck, errcheck, revive, sloglint, depguard's layering rules, ...), go mod tidy -diff; the modules of their own (cmd/internal, testdata/containers) too.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) -C cmd/internal vet ./...
	cd testdata/containers && $(GO) vet ./...
	$(GOLANGCI_LINT) run ./...
	cd cmd/internal && $(GOLANGCI_LINT) run ./...
	$(GO) mod tidy -diff
	$(GO) -C cmd/internal mod tidy -diff
	cd testdata/containers && $(GO) mod tidy -diff

.PHONY: screenshots
screenshots: services ## Regenerate the console's screenshots (docs/console/*.png) with headless Chromium, against dead letters a real runner made on RabbitMQ, SQS and Kafka.
	mkdir -p docs/console
	$(WITH_ENV) IDEMQ_SCREENSHOTS=$(CURDIR)/docs/console $(GO) test -count=1 -timeout 10m -run '^TestConsoleInBrowser$$' ./cmd/idemq

.PHONY: deps-weight
deps-weight: ## Count and weigh the modules a user downloads to import consumer and dedup/pgdedup (fails above 10 modules or 30 MB), and each source alone.
	bash .ci/deps-weight

.PHONY: apicheck
apicheck: ## Compare the exported API with the baseline commit in .ci/api-baseline (apidiff): fails on an incompatible change that CHANGELOG.md does not name.
	bash .ci/apicheck

.PHONY: services
services: ## Install (when missing) and start PostgreSQL, Redis, RabbitMQ, Kafka and ElasticMQ, and the cluster profiles (3-node Kafka, Redis Cluster, Redis with Sentinel), on 127.0.0.1; install Chromium for the browser tests.
	$(SERVICES) up
	$(SERVICES) up kafka-cluster redis-cluster redis-sentinel
	$(SERVICES) browser

.PHONY: services-down
services-down: ## Stop the services that make services started.
	$(SERVICES) down kafka-cluster redis-cluster redis-sentinel
	$(SERVICES) down

.PHONY: services-env
services-env: ## Print the environment the tests read.
	@$(SERVICES) env
