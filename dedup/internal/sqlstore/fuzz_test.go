package sqlstore

import (
	"regexp"
	"strings"
	"testing"
)

// identRE is the identifier rule the stores validate table names with
// (pgdedup and sqldedup validIdent); Render relies on it.
var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// FuzzRender checks Render: with the default names it is the identity, and
// with marked names every occurrence of the default table (or a name derived
// from it) is replaced and nothing else changes, so the rendering decodes
// back to the original SQL.
func FuzzRender(f *testing.F) {
	ms, err := Postgres()
	if err == nil {
		for _, m := range ms {
			f.Add(m.Up, "seen")
			f.Add(m.Down, "processed_messages_v2")
		}
	}
	for _, s := range []string{
		"CREATE TABLE processed_messages (x int)",
		"CREATE INDEX processed_messages_expires_at_idx ON processed_messages (expires_at)",
		"processed_messagesX processed_messages_1 xprocessed_messages processed_messages__ _processed_messages",
		"processed_messages.processed_messages_a;processed_messages\"processed_messages_",
		"", "processed_messages", "PROCESSED_MESSAGES processed_messages_é",
	} {
		f.Add(s, "t")
	}
	f.Fuzz(func(t *testing.T, sql, table string) {
		if got := Render(sql, DefaultTable, DefaultTable, func(s string) string { return s }); got != sql {
			t.Fatalf("Render with the default names changed %q into %q", sql, got)
		}
		if !identRE.MatchString(table) || len(table) > 50 || strings.ContainsRune(sql, 0) {
			return
		}
		const qualified = "\x00T\x00"
		quote := func(s string) string { return "\x00Q" + s + "\x00" }
		out := Render(sql, qualified, table, quote)
		if len(out) > len(sql)+(len(sql)/len(DefaultTable)+1)*(len(table)+4) {
			t.Fatalf("rendering of %d bytes from %d", len(out), len(sql))
		}
		// Decode: every marker back to the default name it replaced.
		var b strings.Builder
		rest := out
		for {
			i := strings.IndexByte(rest, 0)
			if i < 0 {
				b.WriteString(rest)
				break
			}
			b.WriteString(rest[:i])
			rest = rest[i+1:]
			j := strings.IndexByte(rest, 0)
			if j < 0 {
				t.Fatalf("unbalanced marker in %q", out)
			}
			m := rest[:j]
			rest = rest[j+1:]
			switch {
			case m == "T":
				b.WriteString(DefaultTable)
			case strings.HasPrefix(m, "Q"+table+"_"):
				b.WriteString(DefaultTable + strings.TrimPrefix(m, "Q"+table))
			default:
				t.Fatalf("marker %q in %q", m, out)
			}
		}
		if b.String() != sql {
			t.Fatalf("Render(%q) = %q decodes to %q", sql, out, b.String())
		}
		// No default name is left outside the markers.
		for i, part := range strings.Split(out, "\x00") {
			if i%2 == 0 && defaultNameRE.MatchString(part) {
				t.Fatalf("default name left in %q of %q", part, out)
			}
		}
	})
}
