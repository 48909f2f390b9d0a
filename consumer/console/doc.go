// Package console is idemq's operator console as an http.Handler: dead
// letters per broker and queue, grouped by reason, shown safely and
// replayed or purged through the dlq package; the transactional outbox's
// backlog; the dedup stores' tables; and the workers' health, scraped from
// the runners' health endpoints. docs/operations.md ("Console") describes
// every page.
//
// The pages are server-rendered html/template pages with their stylesheet
// and a small script embedded in the binary; they read well with
// JavaScript disabled. `idemq console` serves it; a program can mount it on
// its own mux:
//
//	c, err := console.New(console.Config{Queues: queues, Token: os.Getenv("IDEMQ_CONSOLE_TOKEN")})
//	mux.Handle("/idemq/", c) // with Config.Prefix "/idemq"
//
// # Security
//
// The console is an admin page. Reading needs no credential: bind it where
// only operators reach it. Every mutating action (replay, purge) needs
// Config.Token, from a session cookie signed in on /login or an
// "Authorization: Bearer TOKEN" header, and passes CSRF and cross-origin
// checks; with Config.ReadOnly, or without a Token, every mutation is
// refused with 403. Everything a dead letter carries is escaped as text,
// headers whose names look secret are masked, and the secrets of
// Config.DSNs and the token never appear in a page or a log line.
package console
