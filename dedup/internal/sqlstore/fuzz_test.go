package sqlstore

import (
	"strings"
	"testing"
)

// FuzzRender checks Render: with the default names it is the identity, and
// with marked names every occurrence of the default table (or a name derived
// from it) is replaced and nothing else changes, so the rendering decodes
// back to the original SQL. The table and the failure table keep the
// qualified table's schema; other derived names (indexes) get none.
func FuzzRender(f *testing.F) {
	ms, err := postgresMigrations()
	if err == nil {
		for _, m := range ms {
			f.Add(m, "seen")
			f.Add(m, "processed_messages_v2")
		}
	}
	for _, s := range []string{
		"CREATE TABLE processed_messages (x int)",
		"CREATE INDEX processed_messages_expires_at_idx ON processed_messages (expires_at)",
		"processed_messagesX processed_messages_1 xprocessed_messages processed_messages__ _processed_messages",
		"processed_messages.processed_messages_a;processed_messages\"processed_messages_",
		"processed_messages_failures processed_messages_failures_idx processed_messages_failuresx",
		"", "processed_messages", "PROCESSED_MESSAGES processed_messages_é",
	} {
		f.Add(s, "t")
		f.Add(s, "ab") // with a schema: even lengths
	}
	f.Fuzz(func(t *testing.T, sql, table string) {
		if got := Render(sql, DefaultTable, DefaultTable, func(s string) string { return s }); got != sql {
			t.Fatalf("Render with the default names changed %q into %q", sql, got)
		}
		if !IdentRE.MatchString(table) || len(table) > 50 || strings.ContainsRune(sql, 0) {
			return
		}
		quote := func(s string) string { return "\x00Q" + s + "\x00" }
		schema := ""
		if len(table)%2 == 0 {
			schema = "\x00S\x00."
		}
		out := Render(sql, schema+quote(table), table, quote)
		if len(out) > len(sql)+(len(sql)/len(DefaultTable)+1)*(len(table)+len(schema)+4) {
			t.Fatalf("rendering of %d bytes from %d", len(out), len(sql))
		}
		// Decode: every marker back to the default name it replaced.
		var b strings.Builder
		rest := out
		afterSchema := false
		for {
			i := strings.IndexByte(rest, 0)
			if i < 0 {
				b.WriteString(rest)
				break
			}
			b.WriteString(rest[:i])
			if afterSchema && i > 0 {
				t.Fatalf("schema not followed by a name in %q", out)
			}
			rest = rest[i+1:]
			j := strings.IndexByte(rest, 0)
			if j < 0 {
				t.Fatalf("unbalanced marker in %q", out)
			}
			m := rest[:j]
			rest = rest[j+1:]
			switch {
			case m == "S":
				if schema == "" || !strings.HasPrefix(rest, ".") {
					t.Fatalf("stray schema marker in %q", out)
				}
				rest = rest[1:]
				afterSchema = true
				continue
			case strings.HasPrefix(m, "Q"+table):
				suffix := strings.TrimPrefix(m, "Q"+table)
				if suffix != "" && !strings.HasPrefix(suffix, "_") {
					t.Fatalf("marker %q in %q", m, out)
				}
				qualified := suffix == "" || suffix == FailuresSuffix
				if schema != "" && afterSchema != qualified {
					t.Fatalf("name %q with schema %v in %q", m, afterSchema, out)
				}
				b.WriteString(DefaultTable + suffix)
			default:
				t.Fatalf("marker %q in %q", m, out)
			}
			afterSchema = false
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
