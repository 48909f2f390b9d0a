package metatext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClean(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"plain text, tabs\tand\nlines\r\n", 0, "plain text, tabs\tand\nlines\r\n"},
		{`integer: "1` + "\x01" + `"`, 0, `integer: "1\x01"`},
		{"nul\x00 esc\x1b del\x7f", 0, `nul\x00 esc\x1b del` + "\x7f"},
		{"bad \xff\xfe utf8", 0, `bad \xff\xfe utf8`},
		{"nonchar \ufffe\uffff kept \ufffd é 😀", 0, `nonchar \ufffe\uffff kept ` + "\ufffd é 😀"},
		{"abcdefghij", 10, "abcdefghij"},
		{strings.Repeat("é", 20), 30, "ééééééé" + Truncated},         // 14 + 15 bytes
		{strings.Repeat("\x01", 20), 30, `\x01\x01\x01` + Truncated}, // whole escapes only
		{strings.Repeat("a", 20), 8, "aaaaaaaa"},                     // no room for the marker
		{"aaaaaa\x01", 8, "aaaaaa"},                                  // no room for the escape
	} {
		got := Clean(c.in, c.max)
		if got != c.want {
			t.Errorf("Clean(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
		if !ValidString(got) || c.max > 0 && len(got) > c.max {
			t.Errorf("Clean(%q, %d) = %q: not valid or too long", c.in, c.max, got)
		}
	}
}

func TestValid(t *testing.T) {
	for r, want := range map[rune]bool{
		0: false, 1: false, 8: false, '\t': true, '\n': true, 0xB: false, 0xC: false, '\r': true, 0x1F: false,
		' ': true, 0x7F: true, 0x85: true, 0xD7FF: true, 0xD800: false, 0xDFFF: false, 0xE000: true,
		0xFFFD: true, 0xFFFE: false, 0xFFFF: false, 0x10000: true, utf8.MaxRune: true, utf8.MaxRune + 1: false, -1: false,
	} {
		if Valid(r) != want {
			t.Errorf("Valid(%U) = %v, want %v", r, !want, want)
		}
	}
}

// FuzzClean checks Clean against the XML character range SQS accepts: the
// result is valid UTF-8 within the range and the bound, a valid short text
// is kept as it is, and a cut text is a prefix of the uncut one.
func FuzzClean(f *testing.F) {
	for _, s := range []string{"", "ok", "1\x01", "\xff\xfe", "\ufffe", "\x00\x00\x00", strings.Repeat("é", 100), "tab\tcr\rlf\n"} {
		f.Add(s, 0)
		f.Add(s, 20)
	}
	f.Fuzz(func(t *testing.T, s string, maxBytes int) {
		maxBytes %= 5000
		got := Clean(s, maxBytes)
		if !ValidString(got) {
			t.Fatalf("Clean(%q, %d) = %q holds a character SQS refuses", s, maxBytes, got)
		}
		for _, r := range got {
			if !Valid(r) {
				t.Fatalf("ValidString accepted %U", r)
			}
		}
		if maxBytes > 0 && len(got) > maxBytes {
			t.Fatalf("Clean(%q, %d) is %d bytes long", s, maxBytes, len(got))
		}
		full := Clean(s, 0)
		if !strings.HasPrefix(full, strings.TrimSuffix(got, Truncated)) {
			t.Fatalf("Clean(%q, %d) = %q is not a prefix of %q", s, maxBytes, got, full)
		}
		if ValidString(s) && (maxBytes <= 0 || len(s) <= maxBytes) && got != s {
			t.Fatalf("Clean changed the valid text %q to %q", s, got)
		}
		if maxBytes <= 0 && utf8.ValidString(s) && Clean(full, 0) != full {
			t.Fatalf("Clean(Clean(%q)) changed it again", s)
		}
	})
}
