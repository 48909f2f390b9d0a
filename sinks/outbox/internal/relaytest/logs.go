package relaytest

import (
	"context"
	"log/slog"
	"strings"
	"sync"

	"github.com/idemq/idemq/internal/testenv"
)

// LogLine is a line a LogCapture kept.
type LogLine struct {
	Level   slog.Level
	Message string
	// Attrs are the line's attributes, each value as its String.
	Attrs map[string]string
	// Mark is the testenv.CtxMark of the context the line was logged with.
	Mark string
}

// LogCapture is a slog.Handler that keeps every line with its attributes
// and the testenv.CtxMark of its context. It is safe for concurrent use.
type LogCapture struct {
	mu    sync.Mutex
	lines []LogLine
}

// Logger returns a logger that writes to c.
func (c *LogCapture) Logger() *slog.Logger { return slog.New(c) }

// Enabled reports true at every level.
func (c *LogCapture) Enabled(context.Context, slog.Level) bool { return true }

// Handle keeps the line.
func (c *LogCapture) Handle(ctx context.Context, r slog.Record) error {
	mark, _ := ctx.Value(testenv.CtxMark{}).(string)
	l := LogLine{Level: r.Level, Message: r.Message, Attrs: map[string]string{}, Mark: mark}
	r.Attrs(func(a slog.Attr) bool {
		l.Attrs[a.Key] = a.Value.String()
		return true
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines = append(c.lines, l)
	return nil
}

// WithAttrs returns c: the logger's own attributes are not kept.
func (c *LogCapture) WithAttrs([]slog.Attr) slog.Handler { return c }

// WithGroup returns c: groups are not kept.
func (c *LogCapture) WithGroup(string) slog.Handler { return c }

// Lines returns the lines kept so far whose message starts with prefix.
func (c *LogCapture) Lines(prefix string) []LogLine {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []LogLine
	for _, l := range c.lines {
		if strings.HasPrefix(l.Message, prefix) {
			out = append(out, l)
		}
	}
	return out
}
