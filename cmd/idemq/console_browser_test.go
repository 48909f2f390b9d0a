package main

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemq/idemq/consumer/console"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
)

// consoleToken is the token the browser signs in with.
const consoleToken = "s3cret-console-token"

// tab is a browser tab on a console served at base.
type tab struct {
	t    *testing.T
	ctx  context.Context
	base string
}

// open loads the console's page at path and fails the test unless it
// answered 200.
func (b tab) open(path string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, rigWait)
	defer cancel()
	resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(b.base+path))
	if err != nil {
		b.t.Fatalf("open %s: %v", path, err)
	}
	if resp.Status != http.StatusOK {
		b.t.Fatalf("open %s: status %d", path, resp.Status)
	}
}

// submit clicks the button sel, which submits a form, fails the test
// unless the page it leads to answered 200, and waits until that page,
// loaded, has an element expect.
func (b tab) submit(sel, expect string) {
	b.t.Helper()
	if status := b.click(sel); status != http.StatusOK {
		b.t.Fatalf("click %s: the page answered %d", sel, status)
	}
	b.waitFor(expect+" on the page after a click on "+sel, fmt.Sprintf(`document.readyState === "complete" && !!document.querySelector(%q)`, expect))
}

// click clicks the button sel, which submits a form, and returns the
// status of the page it leads to.
func (b tab) click(sel string) int64 {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, rigWait)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(sel)))
	if err != nil {
		b.t.Fatalf("click %s: %v", sel, err)
	}
	return resp.Status
}

// eval returns the value of a JavaScript expression in the page.
func eval[T any](b tab, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitFor polls the page until the JavaScript expression cond is true. A
// page that is being replaced (a job page without a script reloads itself
// while the job runs) may fail an evaluation: waitFor tries again.
func (b tab) waitFor(what, cond string) {
	b.t.Helper()
	deadline := time.Now().Add(rigWait)
	for {
		ok, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](cond))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("waited %s for %s (%s): %v", rigWait, what, cond, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// header returns a CSS selector of the header cell of table's column
// named name.
func header(b tab, table, name string) string {
	b.t.Helper()
	i := eval[int](b, fmt.Sprintf(`Array.from(document.querySelectorAll(%q)).findIndex(th => th.textContent.trim() === %q)`, "#"+table+" thead th", name))
	if i < 0 {
		b.t.Fatalf("table %s has no column %s", table, name)
	}
	return fmt.Sprintf("#%s thead th:nth-child(%d)", table, i+1)
}

// rows returns the text of the cells sel (a CSS selector relative to each
// row) of the rows of table that are not hidden.
func rows(b tab, table, sel string) []string {
	b.t.Helper()
	return eval[[]string](b, fmt.Sprintf(`Array.from(document.querySelectorAll(%q)).filter(r => !r.hidden).map(r => r.querySelector(%q).textContent.trim())`,
		"#"+table+" tbody tr", sel))
}

// groups returns the reason groups of a queue's page, count by reason,
// each reason shortened to the part of groupSKU or groupDeclined it
// contains (the console's reason adds the runner's words around the
// handler's error).
func groups(b tab) map[string]string {
	b.t.Helper()
	out := map[string]string{}
	for reason, n := range eval[map[string]string](b, `Object.fromEntries(Array.from(document.querySelectorAll("#groups tr.group")).map(r => [r.dataset.reason, r.querySelector(".group-count").textContent.trim()]))`) {
		for _, g := range []string{groupSKU, groupDeclined} {
			if strings.Contains(reason, g) {
				reason = g
			}
		}
		out[reason] = n
	}
	return out
}

// groupRow returns a CSS selector of the row of the reason group that
// contains part.
func groupRow(b tab, part string) string {
	b.t.Helper()
	reason := eval[string](b, fmt.Sprintf(`(Array.from(document.querySelectorAll("#groups tr.group")).find(r => r.dataset.reason.includes(%q)) || {dataset: {reason: ""}}).dataset.reason`, part))
	if reason == "" {
		b.t.Fatalf("no reason group contains %q", part)
	}
	return fmt.Sprintf(`tr.group[data-reason=%q]`, reason)
}

// consoleServer runs idemq console, as an operator would, over the
// rigs' dead-letter stores, the database's dedup table and outbox, and
// the runners' reports, on a free loopback port; it returns the console's
// URL. The command stops at the test's end.
func consoleServer(t *testing.T, db *effectsDB, rigs []*rig) string {
	t.Helper()
	t.Setenv("AWS_REGION", testenv.SQSRegion)
	t.Setenv("AWS_ACCESS_KEY_ID", testenv.SQSAccessKeyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", testenv.SQSSecretAccessKey)
	args := []string{"--addr", "127.0.0.1:0", "--token", consoleToken, "--dsn", db.url, "--schema", db.schema, "--scope", rigScope}
	for _, rg := range rigs {
		args = append(args, rg.flags...)
		args = append(args, "--worker", "orders-"+rg.broker+"="+rg.healthURL)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out, logs runtest.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- runConsole(ctx, args, &out, &logs) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("idemq console: %v\n%s", err, logs.String())
		}
	})
	addr := regexp.MustCompile(`idemq console: (http://\S+)/ `)
	var url string
	runtest.WaitFor(t, rigWait, func() string { return "idemq console to listen: " + out.String() + logs.String() }, func() bool {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
			return true
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("idemq console %s: %v\n%s", strings.Join(args, " "), err, logs.String())
		default:
		}
		return false
	})
	return url
}

// The console in a real browser, over dead letters that real runners made
// on RabbitMQ, SQS (ElasticMQ) and Kafka: the overview counts them per
// queue, each queue's page groups them by reason; the pages read without
// JavaScript; a table sorts and filters; signed in with the token, a
// replay of a group goes through its confirmation, the runners apply each
// replayed message once in PostgreSQL, and the queues drain.
func TestConsoleInBrowser(t *testing.T) {
	chromiumPath(t)
	db := newEffectsDB(t)
	rigs := []*rig{rabbitRig(t, db), sqsRig(t, db), kafkaRig(t, db)}
	for _, rg := range rigs {
		waitDeadLetters(t, rg)
		if n := countDeadLetters(t, rg); n != len(rigPoison) {
			t.Fatalf("%s holds %d dead letters, want %d", rg.queue, n, len(rigPoison))
		}
	}
	base := consoleServer(t, db, rigs)
	b := tab{t: t, ctx: newBrowser(t, browserOptions{}), base: base}
	wantGroups := map[string]string{groupSKU: "2", groupDeclined: "1"}

	t.Run("overview", func(t *testing.T) {
		b.t = t
		b.open("/")
		for _, rg := range rigs {
			row := fmt.Sprintf(`document.querySelector('tr.queue[data-queue=%q]')`, rg.queue)
			got := eval[[]string](b, row+` ? [`+row+`.querySelector(".count").textContent.trim(), `+row+`.querySelector(".groups").textContent.trim()] : []`)
			if !slices.Equal(got, []string{"3", "2"}) {
				t.Errorf("overview row of %s: %q, want 3 dead letters in 2 groups", rg.queue, got)
			}
		}
		screenshot(t, b.ctx, "console-overview")
	})

	t.Run("groups", func(t *testing.T) {
		b.t = t
		for _, rg := range rigs {
			b.open("/dlq/" + rg.queue)
			if got := groups(b); !maps.Equal(got, wantGroups) {
				t.Errorf("%s groups %v, want %v", rg.queue, got, wantGroups)
			}
			keys := rows(b, "letters", ".key")
			slices.Sort(keys)
			if want := brokerKeys(rg.broker, 2, 3, 5); !slices.Equal(keys, want) {
				t.Errorf("%s letters %v, want %v", rg.queue, keys, want)
			}
		}
	})

	t.Run("sort and filter", func(t *testing.T) {
		b.t = t
		rg := rigs[0]
		b.open("/dlq/" + rg.queue)
		// The groups come largest first; a click on the count sorts them
		// ascending, a second one descending.
		order := func() []string {
			var out []string
			for _, r := range rows(b, "groups", ".reason") {
				if strings.Contains(r, groupSKU) {
					r = groupSKU
				} else if strings.Contains(r, groupDeclined) {
					r = groupDeclined
				}
				out = append(out, r)
			}
			return out
		}
		if got := order(); !slices.Equal(got, []string{groupSKU, groupDeclined}) {
			t.Fatalf("groups as served: %v", got)
		}
		countHeader := header(b, "groups", "Dead letters")
		for _, want := range [][]string{{groupDeclined, groupSKU}, {groupSKU, groupDeclined}} {
			if err := chromedp.Do(b.ctx, chromedp.Click(chromedp.CSS(countHeader))); err != nil {
				t.Fatal(err)
			}
			if got := order(); !slices.Equal(got, want) {
				t.Errorf("groups after a click on the count: %v, want %v", got, want)
			}
		}
		keyHeader := header(b, "letters", "Key")
		asc := brokerKeys(rg.broker, 2, 3, 5)
		desc := slices.Clone(asc)
		slices.Reverse(desc)
		for _, want := range [][]string{asc, desc} {
			if err := chromedp.Do(b.ctx, chromedp.Click(chromedp.CSS(keyHeader))); err != nil {
				t.Fatal(err)
			}
			if got := rows(b, "letters", ".key"); !slices.Equal(got, want) {
				t.Errorf("letters after a click on the key: %v, want %v", got, want)
			}
		}
		if err := chromedp.Do(b.ctx, chromedp.SendKeys(chromedp.CSS("#table-filter"), "order-5")); err != nil {
			t.Fatal(err)
		}
		if got, want := rows(b, "letters", ".key"), brokerKeys(rg.broker, 5); !slices.Equal(got, want) {
			t.Errorf("letters shown after filtering on order-5: %v, want %v", got, want)
		}
	})

	t.Run("no JavaScript", func(t *testing.T) {
		nb := tab{t: t, ctx: newBrowser(t, browserOptions{noScript: true}), base: base}
		nb.open("/")
		if got := rows(nb, "queues", ".count"); !slices.Equal(got, []string{"3", "3", "3"}) {
			t.Errorf("overview counts without JavaScript: %v", got)
		}
		for _, rg := range rigs {
			nb.open("/dlq/" + rg.queue)
			if got := groups(nb); !maps.Equal(got, wantGroups) {
				t.Errorf("%s groups without JavaScript: %v, want %v", rg.queue, got, wantGroups)
			}
			if got := rows(nb, "letters", ".key"); len(got) != len(rigPoison) {
				t.Errorf("%s letters without JavaScript: %v", rg.queue, got)
			}
		}
		// The page's script did not run: it makes the headers focusable.
		if got := eval[int](nb, `document.querySelector("#letters thead th:nth-child(3)").tabIndex`); got == 0 {
			t.Errorf("the letters table was made sortable: JavaScript ran")
		}
	})

	t.Run("replay", func(t *testing.T) {
		b.t = t
		// Before signing in, the pages offer no replay, and the console
		// refuses one (a form posted by hand); nothing moves.
		rg := rigs[0]
		b.open("/dlq/" + rg.queue)
		if eval[bool](b, `!!document.querySelector(".group-replay, #replay-all, #replay-selected")`) {
			t.Errorf("%s's page offers a replay before signing in", rg.queue)
		}
		post := fmt.Sprintf(`fetch(%q, {method: "POST", body: new URLSearchParams({action: "replay", all: "1"})}).then(r => r.status)`, "/dlq/"+rg.queue+"/confirm")
		if status, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](post, chromedp.EvalAwaitPromise)); err != nil || status != http.StatusUnauthorized {
			t.Errorf("a replay posted before signing in answered %d (%v), want %d", status, err, http.StatusUnauthorized)
		}
		if n := countDeadLetters(t, rg); n != len(rigPoison) {
			t.Fatalf("%s holds %d dead letters after a refused replay, want %d", rg.queue, n, len(rigPoison))
		}
		for _, token := range []string{"wrong-token", consoleToken} {
			b.open("/login?next=/")
			if err := chromedp.Do(b.ctx, chromedp.SendKeys(chromedp.CSS("#token"), token)); err != nil {
				t.Fatal(err)
			}
			b.click("#login-submit")
			if token != consoleToken {
				b.waitFor("the sign-in error", `document.readyState === "complete" && !!document.querySelector("#login-error")`)
				if eval[bool](b, `!!document.querySelector("#logout")`) {
					t.Fatalf("signed in with a wrong token")
				}
				continue
			}
			b.waitFor("the sign-out button", `document.readyState === "complete" && !!document.querySelector("#logout")`)
		}
		db.broken.Store(false) // the handler is fixed
		for i, rg := range rigs {
			// The SKU group: confirmation, then the job's progress.
			b.open("/dlq/" + rg.queue)
			if i == 0 {
				screenshot(t, b.ctx, "console-queue")
			}
			b.submit(groupRow(b, groupSKU)+" .group-replay button", "#confirm-count")
			if got := eval[string](b, `document.querySelector("#confirm-count").textContent`); got != "2" {
				t.Fatalf("%s: the confirmation counts %q dead letters, want 2", rg.queue, got)
			}
			if i == 0 {
				screenshot(t, b.ctx, "console-confirm")
			}
			b.submit("#confirm-run", "#job-state")
			// With a script, the job page follows the job in place: it
			// must not also reload itself (its meta refresh is for
			// browsers without one), or this mark is lost.
			eval[bool](b, `window.idemqSamePage = true`)
			b.waitFor("the replay to end", `document.readyState === "complete" && document.querySelector("#job-state")?.textContent === "done"`)
			if !eval[bool](b, `window.idemqSamePage === true`) {
				t.Errorf("%s: the job page reloaded itself while its script followed the job", rg.queue)
			}
			if got := eval[string](b, `document.querySelector("#job-done").textContent`); got != "2" {
				t.Errorf("%s: the job replayed %s dead letters, want 2", rg.queue, got)
			}
			if i == 0 {
				screenshot(t, b.ctx, "console-replay")
			}
			waitEffects(t, db, brokerKeys(rg.broker, 1, 2, 3, 4, 6), brokerKeys(rg.broker, 5))
			b.open("/dlq/" + rg.queue)
			if got, want := groups(b), map[string]string{groupDeclined: "1"}; !maps.Equal(got, want) {
				t.Errorf("%s groups after replaying %s: %v, want %v", rg.queue, groupSKU, got, want)
			}
			if n := countDeadLetters(t, rg); n != 1 {
				t.Errorf("%s holds %d dead letters after replaying %s, want 1", rg.queue, n, groupSKU)
			}

			// The rest: the queue drains.
			b.submit("#replay-all", "#confirm-count")
			if got := eval[string](b, `document.querySelector("#confirm-count").textContent`); got != "1" {
				t.Fatalf("%s: the confirmation of the rest counts %q dead letters, want 1", rg.queue, got)
			}
			b.submit("#confirm-run", "#job-state")
			b.waitFor("the replay to end", `document.readyState === "complete" && document.querySelector("#job-state")?.textContent === "done"`)
			waitEffects(t, db, brokerKeys(rg.broker, 1, 2, 3, 4, 5, 6), nil)
			b.open("/dlq/" + rg.queue)
			if !eval[bool](b, `!!document.querySelector("#queue-empty")`) {
				t.Errorf("%s's page after replaying everything: no \"No dead letters\"", rg.queue)
			}
			if n := countDeadLetters(t, rg); n != 0 {
				t.Errorf("%s holds %d dead letters after replaying all, want 0", rg.queue, n)
			}
		}
		b.open("/")
		if got := rows(b, "queues", ".count"); !slices.Equal(got, []string{"0", "0", "0"}) {
			t.Errorf("overview counts after the replays: %v", got)
		}
	})

	// Each order handled published an event to the outbox, which no relay
	// sends; each took effect once, so the runners' table holds a record
	// per order.
	orders := len(rigs) * rigOrders
	t.Run("outbox", func(t *testing.T) {
		b.t = t
		b.open("/outbox")
		if got := eval[string](b, `document.querySelector("#outbox-pending")?.textContent.trim()`); got != fmt.Sprint(orders) {
			t.Errorf("outbox pending %q, want %d", got, orders)
		}
		screenshot(t, b.ctx, "console-outbox")
	})

	t.Run("dedup", func(t *testing.T) {
		b.t = t
		b.open("/dedup")
		if got := rows(b, "dedup-scopes", ".records"); !slices.Equal(got, []string{fmt.Sprint(orders)}) {
			t.Errorf("dedup records of scope %s: %v, want %d", rigScope, got, orders)
		}
		screenshot(t, b.ctx, "console-dedup")
	})

	t.Run("workers", func(t *testing.T) {
		b.t = t
		b.open("/workers")
		if got := rows(b, "workers", ".state"); len(got) != len(rigs) || slices.ContainsFunc(got, func(s string) bool { return s != console.StateReady }) {
			t.Errorf("workers' states: %v, want %d %q", got, len(rigs), console.StateReady)
		}
		screenshot(t, b.ctx, "console-workers")
	})

	// Every order took effect once, and no more after a while.
	for _, rg := range rigs {
		waitEffects(t, db, brokerKeys(rg.broker, 1, 2, 3, 4, 5, 6), nil)
	}
}

// waitEffects waits until each key of want has exactly one row in the
// effects table, and fails the test if a key took effect twice or a key
// of never took effect.
func waitEffects(t *testing.T, db *effectsDB, want, never []string) {
	t.Helper()
	deadline := time.Now().Add(rigWait)
	for {
		got := db.effects(t)
		var missing []string
		for _, k := range want {
			switch got[k] {
			case 0:
				missing = append(missing, k)
			case 1:
			default:
				t.Fatalf("%s took effect %d times", k, got[k])
			}
		}
		for _, k := range never {
			if got[k] != 0 {
				t.Fatalf("%s took effect %d times, want none yet", k, got[k])
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, no effect of %s", rigWait, strings.Join(missing, ", "))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
