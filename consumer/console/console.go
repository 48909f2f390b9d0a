package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemq/idemq/internal/redact"
)

//go:embed assets
var assets embed.FS

// Cookie names.
const (
	sessionCookie = "idemq_console_session"
	csrfCookie    = "idemq_console_csrf"
)

// Console is the operator console. It is an http.Handler, safe for
// concurrent use; Close ends the replays and purges it runs.
type Console struct {
	cfg    Config
	pages  map[string]*template.Template
	static http.Handler
	// key signs the session cookie; a new one at each New, so a restart
	// signs every browser out.
	key     []byte
	handler http.Handler

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	plans map[string]*plan
	jobs  map[string]*job
	busy  map[string]*job // the running job of each queue, by queue name
	// scans holds a token per queue while its store is scanned: one scan
	// of a store at a time, since a second one hides SQS and RabbitMQ dead
	// letters from the first.
	scans   map[string]chan struct{}
	workers map[string]*WorkerStatus
}

// New returns a Console for c, or a *idemq.ConfigError when c is invalid.
// It opens no connection: each page reads its stores when it is served.
func New(c Config) (*Console, error) {
	c, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	static, err := fs.Sub(assets, "assets/static")
	if err != nil {
		return nil, err
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	ctx, cancel := context.WithCancel(context.Background())
	con := &Console{
		cfg: c, pages: pages, static: http.FileServerFS(static), key: key,
		ctx: ctx, cancel: cancel,
		plans: map[string]*plan{}, jobs: map[string]*job{}, busy: map[string]*job{}, workers: map[string]*WorkerStatus{},
		scans: map[string]chan struct{}{},
	}
	for _, q := range c.Queues {
		con.scans[q.Name] = make(chan struct{}, 1)
	}
	con.handler = con.routes()
	return con, nil
}

// Close cancels the replays and purges in progress and waits for them to
// return. A replay cut short loses nothing (see dlq.Replay): what it did
// not remove stays in the dead-letter store.
func (c *Console) Close() error {
	c.cancel()
	c.wg.Wait()
	return nil
}

// ServeHTTP serves the console's pages under Config.Prefix (or without
// it).
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p := c.cfg.Prefix; p != "" && (r.URL.Path == p || strings.HasPrefix(r.URL.Path, p+"/")) {
		r2 := r.Clone(r.Context())
		r2.URL.Path = strings.TrimPrefix(r.URL.Path, p)
		r2.URL.RawPath = ""
		if r2.URL.Path == "" {
			r2.URL.Path = "/"
		}
		r = r2
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	c.handler.ServeHTTP(w, r)
}

func (c *Console) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /static/{file}", http.StripPrefix("/static", c.static))
	mux.HandleFunc("GET /{$}", c.overview)
	mux.HandleFunc("GET /overview.json", c.overviewJSON)
	mux.HandleFunc("GET /dlq/{queue}", c.onQueue(c.queuePage))
	mux.HandleFunc("GET /dlq/{queue}/letter", c.onQueue(c.letterPage))
	mux.HandleFunc("POST /dlq/{queue}/confirm", c.mutation(c.onQueue(c.confirm)))
	mux.HandleFunc("POST /dlq/{queue}/run", c.mutation(c.onQueue(c.run)))
	mux.HandleFunc("GET /jobs/{job}", c.jobPage)
	mux.HandleFunc("GET /jobs/{job}/progress.json", c.jobJSON)
	mux.HandleFunc("GET /outbox", c.outboxPage)
	mux.HandleFunc("GET /dedup", c.dedupPage)
	mux.HandleFunc("GET /workers", c.workersPage)
	mux.HandleFunc("GET /workers.json", c.workersJSON)
	mux.HandleFunc("GET /login", c.loginPage)
	mux.HandleFunc("POST /login", c.login)
	mux.HandleFunc("POST /logout", c.logout)
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.refuse(w, r, http.StatusForbidden, "cross-origin request refused")
	}))
	return cop.Handler(mux)
}

// mutable reports whether the console accepts mutations at all.
func (c *Console) mutable() bool { return !c.cfg.ReadOnly && c.cfg.Token != "" }

// mutation guards a handler that changes a dead-letter store: refused in
// read-only mode, without the token, and without the form's CSRF token
// (unless the token came in an Authorization header, which a cross-site
// form cannot send).
func (c *Console) mutation(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !c.mutable() {
			c.refuse(w, r, http.StatusForbidden, "the console is read-only: replay and purge are disabled")
			return
		}
		bearer, hasBearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		switch {
		case hasBearer:
			if !c.tokenOK(bearer) {
				c.refuse(w, r, http.StatusUnauthorized, "wrong token")
				return
			}
		case !c.signedIn(r):
			c.refuse(w, r, http.StatusUnauthorized, "sign in with the console's token first")
			return
		case !c.csrfOK(r):
			c.refuse(w, r, http.StatusForbidden, "the form's CSRF token is missing or wrong: reload the page and try again")
			return
		}
		next(w, r)
	}
}

// tokenOK compares s with the token in constant time (hashes first, so
// that the length does not show either).
func (c *Console) tokenOK(s string) bool {
	a, b := sha256.Sum256([]byte(s)), sha256.Sum256([]byte(c.cfg.Token))
	return c.cfg.Token != "" && subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// session is the session cookie's value: a MAC of the token under the
// console's key. It reveals nothing of the token.
func (c *Console) session() string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte("session\x00" + c.cfg.Token))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (c *Console) signedIn(r *http.Request) bool {
	ck, err := r.Cookie(sessionCookie)
	return err == nil && c.mutable() && hmac.Equal([]byte(ck.Value), []byte(c.session()))
}

// csrf returns the request's CSRF token, setting its cookie when it has
// none.
func (c *Console) csrf(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == 43 {
		return ck.Value
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	v := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, c.cookie(r, csrfCookie, v))
	return v
}

func (c *Console) csrfOK(r *http.Request) bool {
	ck, err := r.Cookie(csrfCookie)
	return err == nil && ck.Value != "" && hmac.Equal([]byte(ck.Value), []byte(r.PostFormValue("csrf")))
}

func (c *Console) cookie(r *http.Request, name, value string) *http.Cookie {
	return &http.Cookie{Name: name, Value: value, Path: c.cfg.Prefix + "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https"}
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "login", "Sign in", map[string]any{"Next": safeNext(r.URL.Query().Get("next"))})
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if !c.mutable() {
		c.refuse(w, r, http.StatusForbidden, "the console is read-only: there is nothing to sign in for")
		return
	}
	if !c.csrfOK(r) {
		c.refuse(w, r, http.StatusForbidden, "the form's CSRF token is missing or wrong: reload the page and try again")
		return
	}
	if !c.tokenOK(r.PostFormValue("token")) {
		c.log(r.Context(), slog.LevelWarn, "console: sign-in with a wrong token", slog.String("remote", r.RemoteAddr))
		c.render(w, r, http.StatusUnauthorized, "login", "Sign in", map[string]any{"Error": "wrong token", "Next": safeNext(r.PostFormValue("next"))})
		return
	}
	http.SetCookie(w, c.cookie(r, sessionCookie, c.session()))
	c.log(r.Context(), slog.LevelInfo, "console: signed in", slog.String("remote", r.RemoteAddr))
	http.Redirect(w, r, c.cfg.Prefix+safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if !c.csrfOK(r) {
		c.refuse(w, r, http.StatusForbidden, "the form's CSRF token is missing or wrong")
		return
	}
	ck := c.cookie(r, sessionCookie, "")
	ck.MaxAge = -1
	http.SetCookie(w, ck)
	http.Redirect(w, r, c.cfg.Prefix+"/", http.StatusSeeOther)
}

// safeNext returns next when it is a path of the console's own (one
// leading slash), else "/": a sign-in never redirects elsewhere.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/"
	}
	return next
}

// refuse answers an error page with status.
func (c *Console) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, status, "error", http.StatusText(status), map[string]any{"Message": msg})
}

// scrub masks the secrets of Config.DSNs and the token in text.
func (c *Console) scrub(text string) string {
	text = redact.ScrubDSN(text, c.cfg.DSNs...)
	if c.cfg.Token != "" {
		text = strings.ReplaceAll(text, c.cfg.Token, redact.Mask)
	}
	return text
}

// errText is err as a page or a log line shows it: scrubbed.
func (c *Console) errText(err error) string {
	if err == nil {
		return ""
	}
	return c.scrub(err.Error())
}

// log writes a log line; every string attribute is scrubbed.
func (c *Console) log(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	for i, a := range attrs {
		if a.Value.Kind() == slog.KindString {
			attrs[i].Value = slog.StringValue(c.scrub(a.Value.String()))
		}
	}
	c.cfg.Logger.LogAttrs(ctx, level, c.scrub(msg), attrs...)
}

// onQueue serves h with the queue the request's path names, and refuses a
// queue the console does not know.
func (c *Console) onQueue(h func(w http.ResponseWriter, r *http.Request, q *Queue)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("queue")
		for i := range c.cfg.Queues {
			if q := &c.cfg.Queues[i]; q.Name == name {
				h(w, r, q)
				return
			}
		}
		c.refuse(w, r, http.StatusNotFound, "no such dead-letter queue")
	}
}

// readTimeout bounds the reading of a page's stores.
const readTimeout = 30 * time.Second
