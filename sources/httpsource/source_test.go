package httpsource_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/httpsource"
)

// charge is the request body of the test endpoint.
type charge struct {
	Amount int    `json:"amount"`
	Fail   bool   `json:"fail,omitempty"`   // the handler returns an error (nothing stored)
	Reject bool   `json:"reject,omitempty"` // the handler rejects with 402 (nothing stored)
	Block  bool   `json:"block,omitempty"`  // the handler waits for endpoint.release
	Cookie string `json:"cookie,omitempty"` // the response sets this cookie
	Echo   string `json:"echo,omitempty"`   // the response's body holds this
}

// endpoint is a test server: an httpsource.Source on 127.0.0.1:0 with a
// runner on one of the paths and stores.
type endpoint struct {
	base    string // the server's URL
	url     string // base + "/charges"
	release chan struct{}
	started chan struct{} // a blocking handler started
	closed  chan struct{} // if not nil, told when a connection closes
	runs    atomic.Int64  // handler runs
	effects func() int    // committed effects
}

// handle is the endpoint's logic, shared by every backend: id is the new
// charge's id, from the backend's effect.
func (e *endpoint) handle(ctx context.Context, msg *consumer.Message, effect func(amount int) (int64, error)) (httpsource.Response, error) {
	e.runs.Add(1)
	var c charge
	if err := json.Unmarshal(msg.Body, &c); err != nil {
		return httpsource.Response{}, httpsource.Reject(http.StatusBadRequest, "bad JSON")
	}
	if c.Reject {
		return httpsource.Response{}, httpsource.Reject(http.StatusPaymentRequired, "card declined")
	}
	if c.Block {
		e.started <- struct{}{}
		select {
		case <-e.release:
		case <-ctx.Done():
			return httpsource.Response{}, ctx.Err()
		}
	}
	id, err := effect(c.Amount)
	if err != nil {
		return httpsource.Response{}, err
	}
	if c.Fail {
		return httpsource.Response{}, errors.New("handler failed after its effect")
	}
	out := map[string]any{"id": id, "amount": c.Amount}
	if c.Echo != "" {
		out["echo"] = c.Echo
	}
	res, err := httpsource.JSON(http.StatusCreated, out)
	res.Header.Set("Location", fmt.Sprintf("/charges/%d", id))
	if c.Cookie != "" {
		res.Header.Add("Set-Cookie", c.Cookie)
	}
	return res, err
}

// postgresCharges returns a migrated pgdedup store in a schema of the
// test's and the charges table beside it, and sets e.effects to count its
// rows.
func postgresCharges(t *testing.T, e *endpoint) (*pgdedup.Store, string) {
	t.Helper()
	pool, schema := testenv.SchemaPool(t)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{schema, "charges"}.Sanitize()
	if _, err := pool.Exec(context.Background(), `CREATE TABLE `+table+` (id bigserial PRIMARY KEY, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	e.effects = func() int {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Error(err)
		}
		return n
	}
	return store, table
}

type backend struct {
	name  string
	start func(t *testing.T, e *endpoint) (consumer.Path, string) // path and consumer name
}

func backends() []backend {
	return []backend{
		{"postgres", func(t *testing.T, e *endpoint) (consumer.Path, string) {
			store, table := postgresCharges(t, e)
			return consumer.Transactional[pgx.Tx](store, httpsource.Tx(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) (httpsource.Response, error) {
				return e.handle(ctx, msg, func(amount int) (id int64, err error) {
					err = tx.QueryRow(ctx, `INSERT INTO `+table+` (amount) VALUES ($1) RETURNING id`, amount).Scan(&id)
					return id, err
				})
			})), "charges"
		}},
		{"postgres-batch", func(t *testing.T, e *endpoint) (consumer.Path, string) {
			// The batch API: each request's Response set with Respond.
			store, table := postgresCharges(t, e)
			return consumer.TransactionalBatch[pgx.Tx](store, func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
				for _, msg := range msgs {
					res, err := e.handle(ctx, msg, func(amount int) (id int64, err error) {
						err = tx.QueryRow(ctx, `INSERT INTO `+table+` (amount) VALUES ($1) RETURNING id`, amount).Scan(&id)
						return id, err
					})
					if err == nil {
						err = httpsource.Respond(msg, res)
					}
					if err != nil {
						return &consumer.MessageError{Msg: msg, Err: err}
					}
				}
				return nil
			}), "charges"
		}},
		{"sqlite", func(t *testing.T, e *endpoint) (consumer.Path, string) {
			db, err := sqldedup.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "charges.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			store, err := sqldedup.New(db, sqldedup.Config{Dialect: sqldedup.SQLite})
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(`CREATE TABLE charges (id INTEGER PRIMARY KEY AUTOINCREMENT, amount INTEGER NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			e.effects = func() int {
				var n int
				if err := db.QueryRow(`SELECT count(*) FROM charges`).Scan(&n); err != nil {
					t.Error(err)
				}
				return n
			}
			return consumer.Transactional[*sql.Tx](store, httpsource.Tx(func(ctx context.Context, tx *sql.Tx, msg *consumer.Message) (httpsource.Response, error) {
				return e.handle(ctx, msg, func(amount int) (id int64, err error) {
					err = tx.QueryRowContext(ctx, `INSERT INTO charges (amount) VALUES (?) RETURNING id`, amount).Scan(&id)
					return id, err
				})
			})), "charges"
		}},
		{"redis-lease", func(t *testing.T, e *endpoint) (consumer.Path, string) {
			opts, err := redis.ParseURL(testenv.RedisURL(t))
			if err != nil {
				t.Fatal(err)
			}
			rdb := redis.NewClient(opts)
			t.Cleanup(func() { rdb.Close() })
			store, err := redisdedup.New(rdb, redisdedup.Config{})
			if err != nil {
				t.Fatal(err)
			}
			var (
				mu     sync.Mutex
				nextID int64
				done   int
			)
			e.effects = func() int {
				mu.Lock()
				defer mu.Unlock()
				return done
			}
			h := httpsource.Lease(func(ctx context.Context, msg *consumer.Message) (httpsource.Response, error) {
				return e.handle(ctx, msg, func(int) (int64, error) {
					mu.Lock()
					defer mu.Unlock()
					nextID++
					done++
					return nextID, nil
				})
			})
			// A scope of its own: Redis keys outlive the test.
			return consumer.Leased(store, h, consumer.LeaseOptions{}), fmt.Sprintf("charges-%d", time.Now().UnixNano())
		}},
	}
}

// start runs a Source and its runner behind a real net/http server.
func start(t *testing.T, b backend, cfg httpsource.Config) *endpoint {
	t.Helper()
	e := &endpoint{release: make(chan struct{}), started: make(chan struct{}, 8)}
	path, name := b.start(t, e)
	serve(t, e, path, name, cfg)
	return e
}

// serve runs a Source for e and its runner on path, named name, behind a
// real net/http server, and sets e.base and e.url. The source is mounted on
// patterns, by default "POST /charges".
func serve(t *testing.T, e *endpoint, path consumer.Path, name string, cfg httpsource.Config, patterns ...string) {
	t.Helper()
	src, err := httpsource.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := consumer.NewRunner(src, path, consumer.Config{Name: name, Concurrency: 2, BatchSize: 8,
		Retry: consumer.RetryPolicy{InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	mux := http.NewServeMux()
	if len(patterns) == 0 {
		patterns = []string{"POST /charges"}
	}
	for _, p := range patterns {
		mux.Handle(p, src)
	}
	srv := httptest.NewUnstartedServer(mux) // 127.0.0.1:0
	if e.closed != nil {
		srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed {
				e.closed <- struct{}{}
			}
		}
	}
	srv.Start()
	t.Cleanup(func() {
		srv.Close()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return")
		}
	})
	e.base, e.url = srv.URL, srv.URL+"/charges"
}

// reply is one response, read whole.
type reply struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, url, key, body string, hdr ...string) reply {
	t.Helper()
	return do(t, http.MethodPost, url, key, body, hdr...)
}

// do sends a request with key as its Idempotency-Key (none if empty) and
// hdr as pairs of header names and values.
func do(t *testing.T, method, url, key, body string, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Header.Del("Date")
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func wantProblem(t *testing.T, what string, r reply, status int) {
	t.Helper()
	if r.status != status || r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%s: %d %s %q, want %d application/problem+json", what, r.status, r.header.Get("Content-Type"), r.body, status)
	}
	var p struct{ Status int }
	if err := json.Unmarshal([]byte(r.body), &p); err != nil || p.Status != status {
		t.Fatalf("%s: problem body %q (%v), want status %d in it", what, r.body, err, status)
	}
}

// TestSource: every status of docs/http.md, through a real net/http
// server, on PostgreSQL and SQLite (transactional path) and Redis (lease
// path).
func TestSource(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := start(t, b, httpsource.Config{Caller: oneCaller})

			first := post(t, e.url, "k1", `{"amount":500}`)
			if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" ||
				!strings.HasPrefix(first.header.Get("Location"), "/charges/") {
				t.Fatalf("first request: %+v, want 201 with a Location and no replay mark", first)
			}
			for i := range 2 {
				again := post(t, e.url, "k1", `{"amount":500}`)
				if again.header.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("retry %d: %+v, want Idempotent-Replayed: true", i, again)
				}
				again.header.Del("Idempotent-Replayed")
				if again.status != first.status || again.body != first.body || fmt.Sprint(again.header) != fmt.Sprint(first.header) {
					t.Fatalf("retry %d replayed %+v, want byte for byte %+v", i, again, first)
				}
			}
			if n := e.effects(); n != 1 {
				t.Fatalf("%d effects after a request and two retries, want 1", n)
			}

			wantProblem(t, "same key, different payload", post(t, e.url, "k1", `{"amount":501}`), http.StatusUnprocessableEntity)
			// The body is compared byte for byte (docs/http.md): the same
			// fields in another order are another payload.
			if r := post(t, e.url, "k5", `{"amount":2,"cookie":"c=1"}`); r.status != http.StatusCreated {
				t.Fatalf("k5: %+v, want 201", r)
			}
			wantProblem(t, "same key, fields reordered", post(t, e.url, "k5", `{"cookie":"c=1","amount":2}`), http.StatusUnprocessableEntity)
			wantProblem(t, "no key", post(t, e.url, "", `{"amount":1}`), http.StatusBadRequest)

			// A failed handler stores nothing: the retry runs it again.
			failed := post(t, e.url, "k2", `{"amount":7,"fail":true}`)
			wantProblem(t, "failed handler", failed, http.StatusInternalServerError)
			if failed.header.Get("Retry-After") == "" { // its last attempt: MaxAttempts is 1
				t.Fatalf("failed handler: %+v, want Retry-After", failed)
			}
			if b.name != "redis-lease" { // the lease path's effect happened; see docs/http.md
				if n := e.effects(); n != 2 {
					t.Fatalf("%d effects after a failed handler, want 2", n)
				}
			}
			wantProblem(t, "rejected", post(t, e.url, "k3", `{"amount":7,"reject":true}`), http.StatusPaymentRequired)
			runs := e.runs.Load()
			wantProblem(t, "rejected again", post(t, e.url, "k3", `{"amount":7,"reject":true}`), http.StatusPaymentRequired)
			if e.runs.Load() != runs+1 {
				t.Fatalf("a rejected request's retry did not run the handler again")
			}

			// A key in progress gets 409 while its first request runs.
			blocked := make(chan reply, 1)
			go func() { blocked <- post(t, e.url, "k4", `{"amount":9,"block":true}`) }()
			select {
			case <-e.started:
			case <-time.After(20 * time.Second):
				t.Fatal("the blocking handler did not start")
			}
			wantProblem(t, "in progress", post(t, e.url, "k4", `{"amount":9,"block":true}`), http.StatusConflict)
			close(e.release)
			if r := <-blocked; r.status != http.StatusCreated {
				t.Fatalf("blocked request: %+v, want 201", r)
			}
		})
	}
}

// TestSourceCallers: two callers' equal keys are two operations; the same
// caller's retry is a replay. The caller comes from the request.
func TestSourceCallers(t *testing.T) {
	b := backends()[1] // SQLite
	e := start(t, b, httpsource.Config{Caller: tenantCaller})
	a := post(t, e.url, "same", `{"amount":1}`, "X-Tenant", "a")
	bb := post(t, e.url, "same", `{"amount":1}`, "X-Tenant", "b:x")
	if a.status != http.StatusCreated || bb.status != http.StatusCreated || a.body == bb.body {
		t.Fatalf("two tenants, one key: %+v and %+v, want two different charges", a, bb)
	}
	if r := post(t, e.url, "same", `{"amount":1}`, "X-Tenant", "a"); r.header.Get("Idempotent-Replayed") != "true" || r.body != a.body {
		t.Fatalf("tenant a's retry: %+v, want the replay of %q", r, a.body)
	}
	wantProblem(t, "no tenant", post(t, e.url, "same", `{"amount":1}`), http.StatusUnauthorized)
	if n := e.effects(); n != 2 {
		t.Fatalf("%d effects, want 2", n)
	}
}

// TestSourceWaitInProgress: with WaitInProgress a concurrent copy of a key
// waits and gets the first request's response as a replay.
func TestSourceWaitInProgress(t *testing.T) {
	e := start(t, backends()[1], httpsource.Config{Caller: oneCaller, WaitInProgress: true})
	first := make(chan reply, 1)
	go func() { first <- post(t, e.url, "w", `{"amount":3,"block":true}`) }()
	<-e.started
	second := make(chan reply, 1)
	go func() { second <- post(t, e.url, "w", `{"amount":3,"block":true}`) }()
	time.Sleep(50 * time.Millisecond) // let it reach the wait; it passes either way
	close(e.release)
	f, s := <-first, <-second
	if f.status != http.StatusCreated || s.status != http.StatusCreated || s.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal([]byte(f.body), []byte(s.body)) {
		t.Fatalf("first %+v, second %+v; want 201 and its replay", f, s)
	}
}

// TestSourceLeaseInProgressElsewhere: on the lease path, a request whose key
// another instance (another Source and runner on the same Redis and
// consumer name) is handling right now is answered as one in progress at
// this instance: 409, or with WaitInProgress the replay once the other
// finishes.
func TestSourceLeaseInProgressElsewhere(t *testing.T) {
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	store, err := redisdedup.New(rdb, redisdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// instance returns an endpoint on store; those of one name share keys.
	instance := func(t *testing.T, name string, cfg httpsource.Config) *endpoint {
		e := &endpoint{release: make(chan struct{}), started: make(chan struct{}, 8)}
		h := httpsource.Lease(func(ctx context.Context, msg *consumer.Message) (httpsource.Response, error) {
			return e.handle(ctx, msg, func(int) (int64, error) { return 1, nil })
		})
		serve(t, e, consumer.Leased(store, h, consumer.LeaseOptions{Lease: 2 * time.Second}), name, cfg)
		return e
	}

	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("WaitInProgress=%v", wait), func(t *testing.T) {
			name := fmt.Sprintf("busy-%d", time.Now().UnixNano()) // Redis keys outlive the test
			a := instance(t, name, httpsource.Config{Caller: oneCaller})
			b := instance(t, name, httpsource.Config{Caller: oneCaller, WaitInProgress: wait, Timeout: 10 * time.Second})
			var once sync.Once
			release := func() { once.Do(func() { close(a.release) }) }
			t.Cleanup(release) // a's handler returns before its server stops

			first := make(chan reply, 1)
			go func() { first <- post(t, a.url, "k", `{"amount":3,"block":true}`) }()
			select {
			case <-a.started:
			case <-time.After(10 * time.Second):
				t.Fatal("the first request's handler did not start")
			}
			second := make(chan reply, 1)
			go func() { second <- post(t, b.url, "k", `{"amount":3,"block":true}`) }()
			if !wait {
				var r reply
				select {
				case r = <-second:
				case <-time.After(5 * time.Second):
					release()
					t.Fatal("no answer within 5 s to a request whose key another instance handles; want 409 at once")
				}
				release()
				wantProblem(t, "the key in progress at another instance", r, http.StatusConflict)
				if f := <-first; f.status != http.StatusCreated {
					t.Fatalf("first request: %+v, want 201", f)
				}
				return
			}
			time.Sleep(300 * time.Millisecond) // let b claim the key while a holds it; passes either way
			release()
			f, s := <-first, <-second
			if f.status != http.StatusCreated || s.status != http.StatusCreated || s.header.Get("Idempotent-Replayed") != "true" || f.body != s.body {
				t.Fatalf("first %+v, second %+v; want 201 and its replay", f, s)
			}
			if n := b.runs.Load(); n != 0 {
				t.Fatalf("the second instance ran the handler %d times, want 0", n)
			}
		})
	}
}

// TestSourceLeaseStoreResultLimit: a response over the lease store's own
// limit, lower than the runner's, is answered as one over the runner's: the
// effect happened, so the key is done without the response, the request
// gets the response, and the retry gets 204 as a replay without running
// the handler again.
func TestSourceLeaseStoreResultLimit(t *testing.T) {
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	store, err := redisdedup.New(rdb, redisdedup.Config{MaxResultBytes: 64})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := httpsource.Lease(func(ctx context.Context, msg *consumer.Message) (httpsource.Response, error) {
		runs.Add(1)
		return httpsource.JSON(http.StatusCreated, map[string]string{"receipt": strings.Repeat("r", 100)})
	})
	e := &endpoint{}
	serve(t, e, consumer.Leased(store, h, consumer.LeaseOptions{}), fmt.Sprintf("limit-%d", time.Now().UnixNano()), httpsource.Config{Caller: oneCaller})

	if first := post(t, e.url, "k", `{}`); first.status != http.StatusCreated || !strings.Contains(first.body, "rrrr") {
		t.Fatalf("response over the store's limit: %+v, want the 201 response", first)
	}
	again := post(t, e.url, "k", `{}`)
	if again.status != http.StatusNoContent || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %+v, want 204 with Idempotent-Replayed: true", again)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

// oneCaller is a Config.Caller for tests with one caller.
func oneCaller(*http.Request) (string, error) { return "caller", nil }

// tenantCaller is a Config.Caller: the caller is the X-Tenant header.
func tenantCaller(r *http.Request) (string, error) {
	tenant := r.Header.Get("X-Tenant")
	if tenant == "" {
		return "", errors.New("no tenant")
	}
	return tenant, nil
}

// TestSourceSetCookie: a Set-Cookie of the handler's response reaches the
// request that ran it, and is not replayed to a retry: a session cookie is
// the first caller's alone.
func TestSourceSetCookie(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := start(t, b, httpsource.Config{Caller: tenantCaller})
			body := `{"amount":5,"cookie":"session=alice-secret"}`
			first := post(t, e.url, "c1", body, "X-Tenant", "alice")
			if first.status != http.StatusCreated || first.header.Get("Set-Cookie") != "session=alice-secret" {
				t.Fatalf("first request: %+v, want 201 with its Set-Cookie", first)
			}
			again := post(t, e.url, "c1", body, "X-Tenant", "alice")
			if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" || again.body != first.body {
				t.Fatalf("retry: %+v, want the replay of %+v", again, first)
			}
			if c := again.header.Values("Set-Cookie"); len(c) != 0 {
				t.Fatalf("the replay carries Set-Cookie %q, want none", c)
			}
		})
	}
}

// TestSourceRequestFingerprint: a key is bound to its request's method and
// target as well as its body. One source on two routes: the key of a POST
// to account 1 sent to account 2, or with DELETE, is answered 422 like a
// different body, and the handler runs once for the one operation.
func TestSourceRequestFingerprint(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := &endpoint{release: make(chan struct{}), started: make(chan struct{}, 8)}
			path, name := b.start(t, e)
			serve(t, e, path, name, httpsource.Config{Caller: oneCaller}, "POST /accounts/{id}/charges", "DELETE /accounts/{id}")
			body := `{"amount":5}`
			first := do(t, http.MethodPost, e.base+"/accounts/1/charges", "K", body)
			if first.status != http.StatusCreated {
				t.Fatalf("first request: %+v, want 201", first)
			}
			wantProblem(t, "the key on another account", do(t, http.MethodPost, e.base+"/accounts/2/charges", "K", body), http.StatusUnprocessableEntity)
			wantProblem(t, "the key on another method and path", do(t, http.MethodDelete, e.base+"/accounts/3", "K", body), http.StatusUnprocessableEntity)
			wantProblem(t, "the key with a query", do(t, http.MethodPost, e.base+"/accounts/1/charges?dry_run=1", "K", body), http.StatusUnprocessableEntity)
			again := do(t, http.MethodPost, e.base+"/accounts/1/charges", "K", body)
			if again.header.Get("Idempotent-Replayed") != "true" || again.body != first.body {
				t.Fatalf("retry: %+v, want the replay of %+v", again, first)
			}
			if n := e.runs.Load(); n != 1 {
				t.Fatalf("the handler ran %d times, want 1", n)
			}
		})
	}
}

// TestSourceOversizeResponse: a response over the limit the store keeps
// (consumer.Config.MaxResultBytes, 64 KiB). On the lease path the effect
// has happened when the limit is checked: the request gets its response,
// never an error that invites a retry under a new key, and a retry with
// the key gets 204 as a replay without running the handler again. On the
// transactional path nothing was done: 500, and no effect.
func TestSourceOversizeResponse(t *testing.T) {
	big := strings.Repeat("r", 70<<10)
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := start(t, b, httpsource.Config{Caller: oneCaller})
			body := `{"amount":5,"cookie":"s=1","echo":"` + big + `"}` // a 70 KiB response
			first := post(t, e.url, "big", body)
			if b.name != "redis-lease" {
				wantProblem(t, "response over the limit", first, http.StatusInternalServerError)
				if strings.Contains(first.body, "retry") {
					t.Fatalf("the answer %q invites a retry that fails the same way", first.body)
				}
				if n := e.effects(); n != 0 {
					t.Fatalf("%d effects of a request whose response could not be kept, want 0", n)
				}
				return
			}
			if first.status != http.StatusCreated || !strings.Contains(first.body, big) || first.header.Get("Set-Cookie") != "s=1" {
				t.Fatalf("first request: %d %v (%d bytes), want its own 201 response", first.status, first.header, len(first.body))
			}
			again := post(t, e.url, "big", body)
			if again.status != http.StatusNoContent || again.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry: %+v, want 204 with Idempotent-Replayed: true", again)
			}
			if n := e.runs.Load(); n != 1 {
				t.Fatalf("the handler ran %d times, want 1", n)
			}
		})
	}
}

// TestSourceClientLeaves: a client that hangs up does not end its request:
// while the handler still runs, a retry with the key is answered 409 (not
// queued behind it until the Timeout), and once the handler finished the
// retry gets its response as a replay.
func TestSourceClientLeaves(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := &endpoint{release: make(chan struct{}), started: make(chan struct{}, 8), closed: make(chan struct{}, 8)}
			path, name := b.start(t, e)
			serve(t, e, path, name, httpsource.Config{Caller: oneCaller, Timeout: 5 * time.Second})
			var once sync.Once
			release := func() { once.Do(func() { close(e.release) }) }
			t.Cleanup(release)

			body := `{"amount":3,"block":true}`
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(httpsource.HeaderKey, "left")
			left := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				left <- err
			}()
			select {
			case <-e.started:
			case <-time.After(20 * time.Second):
				t.Fatal("the handler did not start")
			}
			cancel() // the client hangs up
			if err := <-left; err == nil {
				t.Fatal("the request that hung up got an answer")
			}
			select {
			case <-e.closed: // the server is done with that request
			case <-time.After(20 * time.Second):
				t.Fatal("the server did not close the connection of the client that left")
			}
			wantProblem(t, "retry while the handler runs", post(t, e.url, "left", body), http.StatusConflict)

			release()
			var again reply
			for range 200 { // bounded: the runner settles the first request soon after its handler returns
				if again = post(t, e.url, "left", body); again.status != http.StatusConflict {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry after the handler finished: %+v, want the replay of its 201", again)
			}
			if n := e.runs.Load(); n != 1 {
				t.Fatalf("the handler ran %d times, want 1", n)
			}
		})
	}
}

// TestSourceKeyLimits: the 1 KiB limit is the client's key's, whatever the
// caller's length; a key over it, or with a control character, is blamed on
// the key (400), and a caller that cannot be recorded on the caller (401).
func TestSourceKeyLimits(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := start(t, b, httpsource.Config{Caller: func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil }})
			long := strings.Repeat("k", consumer.MaxKeyBytes)
			for _, tenant := range []string{"acme", strings.Repeat("a:%", 400)} {
				first := post(t, e.url, long, `{"amount":1}`, "X-Tenant", tenant)
				if first.status != http.StatusCreated {
					t.Fatalf("a 1 KiB key of tenant %.12q...: %+v, want 201", tenant, first)
				}
				again := post(t, e.url, long, `{"amount":1}`, "X-Tenant", tenant)
				if again.header.Get("Idempotent-Replayed") != "true" || again.body != first.body {
					t.Fatalf("its retry: %+v, want the replay of %+v", again, first)
				}
			}
			if other := post(t, e.url, long[1:]+"j", `{"amount":1}`, "X-Tenant", "acme"); other.status != http.StatusCreated || other.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("another 1 KiB key: %+v, want a new 201", other)
			}
			if n := e.effects(); n != 3 {
				t.Fatalf("%d effects, want 3", n)
			}
			for what, key := range map[string]string{"a key over 1 KiB": long + "k", "a key with a TAB": "k\tk"} {
				r := post(t, e.url, key, `{"amount":1}`, "X-Tenant", "acme")
				wantProblem(t, what, r, http.StatusBadRequest)
				if !strings.Contains(r.body, "Idempotency-Key") {
					t.Fatalf("%s: %q, want the key blamed", what, r.body)
				}
			}
			for what, tenant := range map[string]string{"an empty caller": "", "a caller with a TAB": "a\tb"} {
				r := post(t, e.url, "k", `{"amount":1}`, "X-Tenant", tenant)
				wantProblem(t, what, r, http.StatusUnauthorized)
				if !strings.Contains(r.body, "caller") || strings.Contains(r.body, "Idempotency-Key") {
					t.Fatalf("%s: %q, want the caller blamed, not the key", what, r.body)
				}
			}
		})
	}
}
