// Package metatext makes text fit to be written into broker metadata: the
// reason, key and origin that the sources put into a dead letter's headers
// (Kafka, AMQP) or message attributes (SQS).
//
// Metadata is input to the broker. SQS (and ElasticMQ) refuse a message
// attribute holding a character outside the XML 1.0 range (#x9 | #xA | #xD |
// #x20–#xD7FF | #xE000–#xFFFD | #x10000–#x10FFFF) or bytes that are not
// UTF-8, and the dead letter then never lands. Kafka and AMQP accept any
// bytes, but the sources write the same text on every broker, so that a tool
// reading a dead-letter destination sees the same reason whatever the broker:
// the strictest rule, SQS's, applies to all.
package metatext

import (
	"strings"
	"unicode/utf8"
)

// Truncated ends a text that Clean cut to its bound.
const Truncated = " ...(truncated)"

// Valid reports whether r may appear in broker metadata: whether it is in the
// XML 1.0 character range that SQS accepts in a message attribute.
func Valid(r rune) bool {
	switch {
	case r == '\t' || r == '\n' || r == '\r':
		return true
	case r < 0x20:
		return false
	case r <= 0xD7FF:
		return true
	case r < 0xE000:
		return false // surrogates
	case r <= 0xFFFD:
		return true
	case r < 0x10000:
		return false // U+FFFE, U+FFFF
	default:
		return r <= utf8.MaxRune
	}
}

// ValidString reports whether s is valid UTF-8 made only of characters for
// which Valid holds, as Clean returns it.
func ValidString(s string) bool {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return false
			}
		}
		if !Valid(r) {
			return false
		}
	}
	return true
}

// Clean returns s fit for broker metadata, at most maxBytes long (no bound
// if maxBytes <= 0). A character outside the range Valid accepts is written
// as a Go escape (\x01, \ufffe) and a byte that is not UTF-8 as \xff, so the
// text keeps saying what it quoted; everything else is kept as it is. A text
// longer than maxBytes is cut on a character or escape boundary and ends
// with Truncated (when maxBytes leaves room for it). Clean is the identity on
// a short text for which ValidString holds.
func Clean(s string, maxBytes int) string {
	if ValidString(s) && (maxBytes <= 0 || len(s) <= maxBytes) {
		return s
	}
	var b strings.Builder
	b.Grow(min(len(s), max(maxBytes, 0)) + 8)
	// last is the length of b at the last boundary where Truncated still
	// fits within maxBytes.
	room := maxBytes - len(Truncated)
	if room < 0 {
		room = maxBytes
	}
	last := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		var piece string
		switch {
		case r == utf8.RuneError && size == 1:
			piece = `\x` + hex2(s[i])
		case !Valid(r):
			if r < 0x100 {
				piece = `\x` + hex2(byte(r))
			} else {
				piece = `\u` + hex2(byte(r>>8)) + hex2(byte(r))
			}
		default:
			piece = s[i : i+size]
		}
		if maxBytes > 0 && b.Len()+len(piece) > maxBytes {
			out := b.String()[:last]
			if room < maxBytes {
				out += Truncated
			}
			return out
		}
		b.WriteString(piece)
		if b.Len() <= room {
			last = b.Len()
		}
		i += size
	}
	return b.String()
}

// Cut returns s cut to at most n bytes without splitting a UTF-8 sequence.
// A text for which ValidString holds stays so.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func hex2(c byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[c>>4], digits[c&0xf]})
}
