// Package console is idemq's operator console as an http.Handler: dead
// letters per broker and queue, grouped by reason, shown safely and
// replayed or purged through the dlq package; the transactional outbox's
// backlog; the dedup stores' tables; and the workers' health, scraped from
// the runners' health endpoints.
//
// The pages are server-rendered html/template pages with their stylesheet
// and a small script embedded in the binary; they read well with
// JavaScript disabled, and the script only adds live counts, replay
// progress and table sorting and filtering. `idemq console` serves it;
// a program can mount it on its own mux:
//
//	c, err := console.New(console.Config{Queues: queues, Token: os.Getenv("IDEMQ_CONSOLE_TOKEN")})
//	mux.Handle("/idemq/", c) // with Config.Prefix "/idemq"
//
// # Security
//
// The console is an admin page. Reading needs no credential: bind it where
// only operators reach it (`idemq console` listens on 127.0.0.1 by
// default). Every mutating action (replay, purge) needs Config.Token:
// from a browser, signed in once on /login (a session cookie derived from
// the token, HttpOnly, SameSite=Strict); from a script, an
// "Authorization: Bearer TOKEN" header. Tokens are compared in constant
// time. Every form carries a CSRF token (double-submit cookie) and every
// POST passes http.CrossOriginProtection, so a cross-site page cannot
// submit one. With Config.ReadOnly, or without a Token, every mutation is
// refused with 403. Pages are sent with a Content-Security-Policy that
// allows only the console's own script and stylesheet, and everything a
// dead letter carries (body, headers, reason, key) is escaped as text;
// headers whose names look secret (containing pass, secret, token, key,
// auth...) are masked, and the secrets of Config.DSNs and the token never
// appear in a page or a log line.
//
// # Workers
//
// The Workers page scrapes each Config.Workers URL when it is served:
// consumer.HealthHandler's readyz, or the handler of a WorkerReporter,
// which adds the in-flight count, the lag and the last error. A worker
// that does not answer within Config.ScrapeTimeout shows as gone.
package console
