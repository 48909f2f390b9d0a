package testenv

import (
	"context"
	"log/slog"
	"strings"
	"sync"
)

// CtxMark is a context key whose value a test puts in the context it hands
// to the code under test, and then looks for in the contexts its log lines
// were made with (LogRecorder), to prove a log call passed the caller's ctx
// on, so that trace-aware handlers can tie the line to its message.
type CtxMark struct{}

// MarkedContext returns ctx carrying mark under CtxMark.
func MarkedContext(ctx context.Context, mark string) context.Context {
	return context.WithValue(ctx, CtxMark{}, mark)
}

// LoggedRecord is one log line a LogRecorder saw.
type LoggedRecord struct {
	Level   slog.Level
	Message string
	// Mark is the CtxMark value of the context the line was logged with,
	// "" if it had none.
	Mark string
}

// LogRecorder is a slog.Handler that records every line at Debug level and
// above, with the CtxMark of its context. It is safe for concurrent use.
type LogRecorder struct {
	mu      sync.Mutex
	records []LoggedRecord
}

// NewLogRecorder returns an empty LogRecorder.
func NewLogRecorder() *LogRecorder {
	return &LogRecorder{}
}

// Logger returns a logger that writes to r.
func (r *LogRecorder) Logger() *slog.Logger { return slog.New(r) }

// Enabled reports true for Debug and above.
func (r *LogRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelDebug }

// Handle records the line.
func (r *LogRecorder) Handle(ctx context.Context, rec slog.Record) error {
	mark, _ := ctx.Value(CtxMark{}).(string)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, LoggedRecord{Level: rec.Level, Message: rec.Message, Mark: mark})
	return nil
}

// WithAttrs returns r: attributes are not recorded.
func (r *LogRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }

// WithGroup returns r: groups are not recorded.
func (r *LogRecorder) WithGroup(string) slog.Handler { return r }

// Find returns the recorded lines whose message starts with prefix.
func (r *LogRecorder) Find(prefix string) []LoggedRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []LoggedRecord
	for _, rec := range r.records {
		if strings.HasPrefix(rec.Message, prefix) {
			out = append(out, rec)
		}
	}
	return out
}
