// Command http-charges is a payments API on idemq: POST /charges with an
// Idempotency-Key creates a charge and moves an account's balance in one
// transaction, together with the key's record and the response; a retry
// with the same key (after a 504, a dropped connection, a crash) gets the
// same response, byte for byte, and charges nothing again. Keys are the
// authenticated caller's own: the bearer token names the caller (two demo
// callers, alice-token and bob-token), and two callers' equal keys are two
// charges.
//
//	go run ./examples/http-charges -addr 127.0.0.1:8088 -dsn sqlite:charges.db
//	go run ./examples/http-charges -addr 127.0.0.1:8088 -dsn postgres://localhost/shop
//
//	curl -si -X POST http://127.0.0.1:8088/charges -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: 3f6c' -d '{"account": 7, "amount": 500}'
//	curl -s http://127.0.0.1:8088/accounts/7
//
// `go run ./examples/http-charges client -url http://127.0.0.1:8088` is a
// Go client whose first response is dropped: its retry gets the same charge.
// docs/http.md is the reference.
package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/sources/httpsource"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "client" {
		if err := client(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "http-charges client:", err)
			os.Exit(1)
		}
		return
	}
	addr := flag.String("addr", "127.0.0.1:8088", "listen address")
	dsn := flag.String("dsn", "sqlite:charges.db", "database: sqlite:PATH or a postgres:// URL")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, *addr, *dsn, log); err != nil {
		log.ErrorContext(ctx, "http-charges", "err", err)
		os.Exit(1)
	}
}

// Charge is the request of POST /charges and, with its id and the new
// balance, its response.
type Charge struct {
	ID      int64 `json:"id,omitempty"`
	Account int64 `json:"account"`
	Amount  int64 `json:"amount"`
	Balance int64 `json:"balance"`
}

// callers maps a bearer token to the caller it authenticates. A real API
// checks its credentials against its own store; the example knows two.
var callers = map[string]string{"alice-token": "alice", "bob-token": "bob"}

// caller is the Source's Caller: who the request's bearer token
// authenticates. Its keys are its own: another caller's equal key is
// another operation, and never shows this caller's answer.
func caller(r *http.Request) (string, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if name := callers[token]; ok && name != "" {
		return name, nil
	}
	return "", errors.New("a known bearer token is required")
}

// createCharge is the endpoint: everything it writes through tx commits
// with the key's record and the response it returns, or not at all.
func createCharge(ctx context.Context, tx *sql.Tx, msg *consumer.Message) (httpsource.Response, error) {
	var c Charge
	if detail := decode(msg.Body, &c); detail != "" {
		return httpsource.Response{}, httpsource.Reject(http.StatusBadRequest, detail)
	}
	if c.Amount <= 0 || c.Account <= 0 {
		return httpsource.Response{}, httpsource.Reject(http.StatusUnprocessableEntity, "account and amount must be positive")
	}
	err := tx.QueryRowContext(ctx, `INSERT INTO accounts (id, balance) VALUES ($1, $2)
ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + excluded.balance RETURNING balance`,
		c.Account, c.Amount).Scan(&c.Balance)
	if err != nil {
		return httpsource.Response{}, err
	}
	err = tx.QueryRowContext(ctx, `INSERT INTO charges (account, amount) VALUES ($1, $2) RETURNING id`,
		c.Account, c.Amount).Scan(&c.ID)
	if err != nil {
		return httpsource.Response{}, err
	}
	res, err := httpsource.JSON(http.StatusCreated, c)
	res.Header.Set("Location", "/charges/"+strconv.FormatInt(c.ID, 10))
	return res, err
}

// serve runs the API until ctx is done.
func serve(ctx context.Context, addr, dsn string, log *slog.Logger) error {
	db, dialect, err := open(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	store, err := sqldedup.New(db, sqldedup.Config{Dialect: dialect})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	for _, ddl := range schema(dialect) {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("schema: %w", err)
		}
	}

	src, err := httpsource.New(httpsource.Config{Caller: caller, Logger: log})
	if err != nil {
		return err
	}
	cfg := consumer.Config{Name: "charges", Concurrency: 8, BatchSize: 32, Logger: log}
	if dialect == sqldedup.SQLite {
		cfg.Concurrency = 1 // one writer: batches share its commits
	}
	runner, err := consumer.NewRunner(src, consumer.Transactional[*sql.Tx](store, httpsource.Tx(createCharge)), cfg)
	if err != nil {
		return err
	}
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	ran := make(chan error, 1)
	go func() { ran <- runner.Run(runCtx) }()

	mux := http.NewServeMux()
	mux.Handle("POST /charges", src)
	mux.HandleFunc("GET /accounts/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if err != nil {
			http.Error(w, "bad account id", http.StatusBadRequest)
			return
		}
		var balance int64
		err = db.QueryRowContext(r.Context(), `SELECT balance FROM accounts WHERE id = $1`, id).Scan(&balance)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			log.ErrorContext(r.Context(), "reading a balance", "account", id, "err", err)
			http.Error(w, "the balance cannot be read now", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, "{\"account\":%d,\"balance\":%d}\n", id, balance)
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe() }()
	log.InfoContext(ctx, "http-charges listening", "addr", addr)

	select {
	case err := <-served:
		cancelRun()
		return errors.Join(err, <-ran)
	case <-ctx.Done():
	}
	// Requests in flight wait for the runner: stop the server first.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdownCtx)
	cancelRun()
	return errors.Join(err, <-ran)
}

// open opens dsn: sqlite:PATH or a postgres:// URL.
func open(ctx context.Context, dsn string) (*sql.DB, sqldedup.Dialect, error) {
	if path, ok := strings.CutPrefix(dsn, "sqlite:"); ok {
		db, err := sqldedup.OpenSQLite(ctx, path)
		return db, sqldedup.SQLite, err
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, "", err
	}
	db.SetMaxOpenConns(12) // Concurrency 8, plus the GETs and the janitor
	return db, sqldedup.Postgres, db.PingContext(ctx)
}

// schema is the business tables of dialect.
func schema(d sqldedup.Dialect) []string {
	if d == sqldedup.SQLite {
		return []string{
			`CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)`,
			`CREATE TABLE IF NOT EXISTS charges (id INTEGER PRIMARY KEY AUTOINCREMENT, account INTEGER NOT NULL, amount INTEGER NOT NULL)`,
		}
	}
	return []string{
		`CREATE TABLE IF NOT EXISTS accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS charges (id bigserial PRIMARY KEY, account bigint NOT NULL, amount bigint NOT NULL)`,
	}
}

// decode reads a JSON request body into v, refusing unknown fields. It
// returns what is wrong with the body, in the client's terms (JSON field
// names, never Go types), or "" when it decoded.
func decode(body []byte, v any) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var typeErr *json.UnmarshalTypeError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &typeErr) && typeErr.Field != "":
		return fmt.Sprintf("the field %q cannot be a JSON %s", typeErr.Field, typeErr.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "the body has an unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	}
	return "the body is not a JSON charge"
}
