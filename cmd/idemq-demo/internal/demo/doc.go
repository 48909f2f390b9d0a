// Package demo is the machinery of `make demo` (cmd/idemq-demo): a supervisor that runs the
// checkout worker (../checkout) as real child processes, kills them
// with SIGKILL at random moments (seeded), restarts them, while a chaos
// producer sends orders, re-sends some with the same idempotency key and adds
// malformed ones; then it reads the ledger and checks the proof: every valid
// order charged exactly once, none twice, the malformed ones dead-lettered.
//
// By default the broker is an in-process Kafka-protocol cluster
// (github.com/twmb/franz-go/pkg/kfake) that the supervisor runs on
// 127.0.0.1, so the real kafka-go adapter (sources/kafkasource) runs in the
// workers, and the store is a SQLite file (dedup/sqldedup). Config selects a
// real Kafka cluster and PostgreSQL instead, or the in-memory broker (then
// workers run in-process and are stopped instead of killed).
//
// Forced redeliveries come from three places: the kills (offsets not yet
// committed are delivered again to the next worker), acknowledgements the
// workers drop on purpose before their last life (Config.DropAcks: on Kafka
// they hold back the partition's committed offset until the next kill), and
// the producer's re-sent copies. The runner absorbs all of them: the ledger
// has no unique constraint on order_id, so a double charge would show.
//
// The second hop (unless Config.NoChain): each charge also publishes an
// "order charged" event with outbox.Publish in its transaction
// (checkout.EnableEvents). An outbox relay in the supervisor publishes the
// committed events to an in-process memsource broker (with injected
// duplicate deliveries) and, for a tenth of its batches, reports an outage
// after the broker took them, as a relay that died between the confirm and
// the row update would: those events go out again with the same ids. A
// notifier runner on the lease path (in-memory lease store) sends each
// event through sinks/webhook to a receiver on 127.0.0.1 that counts the
// requests per Idempotency-Key; the proof requires every order notified
// exactly once.
//
// Each worker runs a consumer.Hook that counts duplicates by reason and
// histograms handler and commit times; its counts travel with the runner's
// counters in the worker's reports, and Summary.Print shows them after the
// counters, before the proof (Summary.Metrics).
//
// Workers get the PostgreSQL URL in their environment (WorkerDatabaseEnv),
// never on their command line, which every user of the machine can read.
//
// The package is internal: its API serves cmd/idemq-demo and its tests only.
package demo
