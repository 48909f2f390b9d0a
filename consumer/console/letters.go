package console

import (
	"encoding/hex"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/internal/redact"
)

// letterView is a dead letter as a page shows it: every text scrubbed, the
// secret-looking headers masked and the body as text or hex.
type letterView struct {
	ID, Key, Reason, Group, Origin string
	Attempts                       int
	At                             time.Time
	Size, Shown                    int
	// Text is the body when it is printable UTF-8; else Hex is its hex
	// dump.
	Text, Hex string
	Headers   []header
}

type header struct{ Name, Value string }

// view renders l for a page.
func (c *Console) view(l *dlq.Letter) letterView {
	body := l.Body[:min(len(l.Body), dlq.PreviewBytes)] // all of it, from a Broker that keeps the contract
	v := letterView{
		ID: l.ID, Key: c.scrub(l.Key), Reason: c.scrub(l.Reason), Group: normalizeReason(c.scrub(l.Reason)),
		Origin: c.scrub(l.Origin), Attempts: l.Attempts, At: l.DeadLetteredAt, Size: l.Size, Shown: len(body),
	}
	if printable(body) {
		v.Text = c.scrub(string(body))
	} else {
		v.Hex = hex.Dump(body)
	}
	for k, val := range l.Headers {
		if redact.SecretKey(k) {
			val = redact.Mask
		}
		v.Headers = append(v.Headers, header{Name: c.scrub(k), Value: c.scrub(val)})
	}
	slices.SortFunc(v.Headers, func(a, b header) int { return strings.Compare(a.Name, b.Name) })
	return v
}

// printable reports whether b is valid UTF-8 without control characters
// other than tab, newline and carriage return.
func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\n' && r != '\t' && r != '\r' {
			return false
		}
	}
	return true
}

// group is the dead letters that share a normalised reason.
type group struct {
	Reason string
	Count  int
	// Example is one of the original reasons; First and Last bound their
	// times.
	Example     string
	First, Last time.Time
	Keys        []string
}

// groupLetters groups ls by normalised reason, largest group first.
func groupLetters(ls []*dlq.Letter) []*group {
	by := map[string]*group{}
	var out []*group
	for _, l := range ls {
		n := normalizeReason(l.Reason)
		g := by[n]
		if g == nil {
			g = &group{Reason: n, Example: l.Reason}
			by[n] = g
			out = append(out, g)
		}
		g.Count++
		if t := l.DeadLetteredAt; !t.IsZero() {
			if g.First.IsZero() || t.Before(g.First) {
				g.First = t
			}
			if t.After(g.Last) {
				g.Last = t
			}
		}
	}
	slices.SortStableFunc(out, func(a, b *group) int { return b.Count - a.Count })
	return out
}

// The parts of a reason that vary between occurrences of one error.
var (
	uuidRE   = regexp.MustCompile(`(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`)
	hexRE    = regexp.MustCompile(`(?i)\b(0x)?[0-9a-f]*[0-9][0-9a-f]*[a-f][0-9a-f]*\b|\b(0x)?[0-9a-f]*[a-f][0-9a-f]*[0-9][0-9a-f]*\b`)
	quotedRE = regexp.MustCompile(`"[^"]*"|'[^']*'`)
	numberRE = regexp.MustCompile(`\d+(\.\d+)?`)
	spaceRE  = regexp.MustCompile(`\s+`)
)

// normalizeReason is the group of a dead letter's reason: the error text
// with what varies between occurrences of one error (quoted values, UUIDs,
// hexadecimal ids of 8 digits or more, numbers) replaced by placeholders,
// and white space collapsed, as ServicePulse groups failed messages by
// exception type and message.
func normalizeReason(s string) string {
	s = uuidRE.ReplaceAllString(s, "<id>")
	s = quotedRE.ReplaceAllString(s, `"…"`)
	s = hexRE.ReplaceAllStringFunc(s, func(m string) string {
		if len(strings.TrimPrefix(strings.ToLower(m), "0x")) >= 8 {
			return "<id>"
		}
		return m
	})
	s = numberRE.ReplaceAllString(s, "<n>")
	s = strings.TrimSpace(spaceRE.ReplaceAllString(s, " "))
	if s == "" {
		return "(no reason)"
	}
	return s
}
