package console

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/idemq/idemq/consumer/dlq"
)

// planTTL is how long a confirmation page's plan can be run.
const planTTL = 15 * time.Minute

// plan is a replay or purge the operator was asked to confirm: the dead
// letters selected when the confirmation page was shown, by ID.
type plan struct {
	ID      string
	Queue   string
	Action  string // "replay" or "purge"
	IDs     []string
	Letters []letterView
	Created time.Time
}

// job is a replay or purge running or done. Its ID, Queue, Action, Total
// and Started do not change; mu guards the rest of its state.
type job struct {
	mu sync.Mutex
	jobState
}

// jobState is a job's progress, for its page and progress.json.
type jobState struct {
	ID      string    `json:"id"`
	Queue   string    `json:"queue"`
	Action  string    `json:"action"`
	Total   int       `json:"total"`
	Done    int       `json:"done"`
	Running bool      `json:"running"`
	Error   string    `json:"error,omitempty"`
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended,omitzero"`
}

func (j *job) state() jobState {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.jobState
}

func newID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// confirm selects the dead letters of a replay or purge (the checked IDs,
// a group, or every one read) and shows how many will move, with the form
// that runs it.
func (c *Console) confirm(w http.ResponseWriter, r *http.Request, q *Queue) {
	action := r.PostFormValue("action")
	if action != "replay" && action != "purge" {
		c.refuse(w, r, http.StatusBadRequest, "action must be replay or purge")
		return
	}
	ids, group, all := r.PostForm["id"], r.PostFormValue("group"), r.PostFormValue("all") == "1"
	if len(ids) == 0 && group == "" && !all {
		c.refuse(w, r, http.StatusBadRequest, "select dead letters, a group, or all")
		return
	}
	ls, more, busy, err := c.list(r.Context(), q, dlq.Filter{})
	switch {
	case busy:
		c.refuse(w, r, http.StatusConflict, "a replay or purge of this queue is running: wait for it to end")
		return
	case err != nil:
		c.refuse(w, r, http.StatusBadGateway, "reading the dead letters failed: "+c.errText(err))
		return
	}
	p := &plan{ID: newID(), Queue: q.Name, Action: action, Created: time.Now()}
	for _, l := range ls {
		if (all || (group != "" && normalizeReason(l.Reason) == group) || slices.Contains(ids, l.ID)) && !slices.Contains(p.IDs, l.ID) {
			p.IDs = append(p.IDs, l.ID)
			p.Letters = append(p.Letters, c.view(l))
		}
	}
	c.mu.Lock()
	for id, old := range c.plans {
		if time.Since(old.Created) > planTTL {
			delete(c.plans, id)
		}
	}
	c.plans[p.ID] = p
	c.mu.Unlock()
	c.render(w, r, http.StatusOK, "confirm", "Confirm "+action+" — idemq console", map[string]any{
		"Queue": q, "Plan": p, "Count": len(p.IDs), "More": more && all, "Limit": listLimit,
	})
}

// run starts a confirmed plan and redirects to its progress page.
func (c *Console) run(w http.ResponseWriter, r *http.Request, q *Queue) {
	c.mu.Lock()
	p := c.plans[r.PostFormValue("plan")]
	if p == nil || p.Queue != q.Name || time.Since(p.Created) > planTTL {
		c.mu.Unlock()
		c.refuse(w, r, http.StatusBadRequest, "this confirmation expired or was already used: select the dead letters again")
		return
	}
	if c.busy[q.Name] != nil {
		c.mu.Unlock()
		c.refuse(w, r, http.StatusConflict, "a replay or purge of this queue is running: wait for it to end")
		return
	}
	delete(c.plans, p.ID)
	j := &job{jobState: jobState{ID: newID(), Queue: q.Name, Action: p.Action, Total: len(p.IDs), Started: time.Now(), Running: true}}
	c.jobs[j.ID] = j
	c.busy[q.Name] = j
	c.wg.Add(1)
	c.mu.Unlock()
	c.log(r.Context(), slog.LevelInfo, "console: "+p.Action+" started", slog.String("queue", q.Name), slog.Int("dead_letters", len(p.IDs)),
		slog.String("job", j.ID), slog.String("remote", r.RemoteAddr))
	go c.execute(q, p, j)
	http.Redirect(w, r, c.cfg.Prefix+"/jobs/"+j.ID, http.StatusSeeOther)
}

// execute runs p through dlq.Replay or dlq.Purge: a dead letter is removed
// only after its origin confirmed the copy.
func (c *Console) execute(q *Queue, p *plan, j *job) {
	defer c.wg.Done()
	ctx := c.ctx
	err := func() error {
		if len(p.IDs) == 0 {
			return nil
		}
		// Wait for a listing that began before the job to end.
		select {
		case c.scans[q.Name] <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		defer func() { <-c.scans[q.Name] }()
		b, err := q.Open(ctx)
		if err != nil {
			return err
		}
		defer b.Close()
		o := dlq.Options{Failures: q.Failures, Scope: q.Scope, Progress: func(done int) {
			j.mu.Lock()
			j.Done = done
			j.mu.Unlock()
		}}
		f := dlq.Filter{IDs: p.IDs}
		var res dlq.Result
		if p.Action == "replay" {
			res, err = dlq.Replay(ctx, b, f, o)
		} else {
			res, err = dlq.Purge(ctx, b, f, o)
		}
		j.mu.Lock()
		j.Done = res.Done
		j.mu.Unlock()
		return err
	}()
	j.mu.Lock()
	j.Running, j.Ended = false, time.Now()
	if err != nil {
		j.Error = c.errText(err)
	}
	st := j.jobState
	j.mu.Unlock()
	c.mu.Lock()
	delete(c.busy, q.Name)
	c.mu.Unlock()
	level := slog.LevelInfo
	if st.Error != "" {
		level = slog.LevelError
	}
	c.log(ctx, level, "console: "+p.Action+" ended", slog.String("queue", q.Name), slog.String("job", st.ID),
		slog.Int("done", st.Done), slog.Int("selected", len(p.IDs)), slog.String("error", st.Error))
}

func (c *Console) job(r *http.Request) *job {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.jobs[r.PathValue("job")]
}

func (c *Console) jobPage(w http.ResponseWriter, r *http.Request) {
	j := c.job(r)
	if j == nil {
		c.refuse(w, r, http.StatusNotFound, "no such replay or purge")
		return
	}
	st := j.state()
	c.render(w, r, http.StatusOK, "job", st.Action+" of "+st.Queue+" — idemq console", map[string]any{"Job": st})
}

func (c *Console) jobJSON(w http.ResponseWriter, r *http.Request) {
	j := c.job(r)
	if j == nil {
		http.NotFound(w, r)
		return
	}
	writeJSON(w, http.StatusOK, j.state())
}
