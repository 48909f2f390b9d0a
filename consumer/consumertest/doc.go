// Package consumertest replays redelivered messages against your own handler,
// so that your tests can show that its effect happens exactly once.
//
// ReplayTx runs a handler of the transactional path through real Runners
// (two competing workers by default) over the in-memory broker of
// consumer/memsource, which delivers a script of messages with faults (the
// kinds of FaultKind, the one vocabulary every in-memory kit speaks under the
// same names): redeliveries, concurrent duplicates, lost
// acknowledgements after commit (a crash between commit and ack), producer
// duplicates, and failures after the handler ran (so that its writes must roll
// back). Run it against a real database — for example a pgdedup.Store on a
// test schema — and then check the returned Report and your own tables:
//
//	rep := consumertest.ReplayTx(t, store, charge, []consumertest.Delivery{
//		{Key: "order-1", Body: body1, Fault: consumertest.ConcurrentDuplicate},
//		{Key: "order-2", Body: body2, Fault: consumertest.CrashAfterCommit},
//		{Key: "order-3", Body: body3, FailFirst: 2},
//	}, consumertest.Options{})
//	rep.RequireExactlyOnce(t)
//	// and: SELECT count(*) FROM ledger ... = 3
//
// Replay does the same for the lease path.
//
// The runners see your store with every optional interface it has (the
// table in the dedup package doc): failures are counted in the store and the
// connection pool is checked against the concurrency, as in production.
package consumertest
