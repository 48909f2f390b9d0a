// Package httpsource is an HTTP endpoint with the Idempotency-Key header
// (IETF draft "The Idempotency-Key HTTP Header Field") on idemq's runner:
// each request becomes a delivery of a consumer.Source, handled by the same
// Runner, lanes, batching, stores, hooks and telemetry as a broker's
// messages, and is answered from its outcome.
//
//	src, _ := httpsource.New(httpsource.Config{Caller: caller}) // the authenticated caller: keys are its own
//	path := consumer.Transactional(store, httpsource.Tx(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) (httpsource.Response, error) {
//		... // write through tx
//		return httpsource.JSON(http.StatusCreated, charge)
//	}))
//	runner, _ := consumer.NewRunner(src, path, consumer.Config{Name: "charges"})
//	mux.Handle("POST /charges", src)
//
// Keys belong to the caller that Config.Caller names. The handler's
// Response is stored with the request's record in the same transaction (or
// next to the lease path's done key), so a retried request with the same
// key gets the original status, headers and body byte for byte, marked
// Idempotent-Replayed: true, without running the handler; a failed handler
// stores nothing, so the client's retry runs it again. docs/http.md is the
// reference, with every status the source answers.
package httpsource
