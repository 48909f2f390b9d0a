// Package redact hides the secrets of URLs and database DSNs before they are
// printed: in help text, errors, logs and dead-letter reasons.
//
// A redacted URL keeps its scheme, user name, host and port, which say where
// a connection went, and replaces the password, the path, the query and the
// fragment, which may hold credentials (a token in a webhook path or query, a
// password in sslpassword=), with Mask. A key=value DSN keeps the values of
// the keys in KeptKeys and masks every other value. Anything else that may be
// a DSN (a bare file path, a form this package does not know) is masked
// whole.
//
// DSN and ScrubDSN are the milder form for what a user typed on a command
// line: they hide passwords and secret parameters only, and keep database
// names and file paths, which the user needs to see in an error.
package redact

import (
	"errors"
	"net/url"
	"strings"
)

// Mask replaces every hidden part.
const Mask = "xxxxx"

// KeptKeys are the keys of a key=value DSN whose values are printed: they say
// where a connection goes and carry no secret.
var KeptKeys = []string{"host", "hostaddr", "port", "user", "sslmode", "connect_timeout"}

// URL returns u with its password, path, query and fragment masked.
func URL(u *url.URL) string {
	if u == nil {
		return ""
	}
	var b strings.Builder
	if u.Scheme != "" {
		b.WriteString(u.Scheme)
		b.WriteByte(':')
	}
	if u.Opaque != "" {
		b.WriteString(Mask)
	} else if u.Scheme != "" || u.Host != "" || u.User != nil {
		b.WriteString("//")
		if u.User != nil {
			b.WriteString(url.PathEscape(u.User.Username()))
			if _, ok := u.User.Password(); ok {
				b.WriteString(":" + Mask)
			}
			b.WriteByte('@')
		}
		b.WriteString(u.Host)
	}
	if u.Path == "/" && u.RawPath == "" {
		b.WriteByte('/')
	} else if u.Path != "" || u.RawPath != "" {
		if u.Opaque == "" && (u.Host != "" || u.Scheme != "") {
			b.WriteByte('/')
		}
		b.WriteString(Mask)
	}
	if u.RawQuery != "" || u.ForceQuery {
		b.WriteString("?" + Mask)
	}
	if u.Fragment != "" || u.RawFragment != "" {
		b.WriteString("#" + Mask)
	}
	return b.String()
}

// String returns s, a URL or DSN of any form, with its secrets masked; see the
// package documentation.
func String(s string) string {
	switch {
	case s == "":
		return ""
	case strings.Contains(s, "://"):
		if u, err := url.Parse(s); err == nil {
			return URL(u)
		}
		scheme, _, _ := strings.Cut(s, "://")
		if isScheme(scheme) {
			return scheme + "://" + Mask
		}
		return Mask
	case isKeyValue(s):
		return keyValue(s)
	}
	if scheme, rest, ok := strings.Cut(s, ":"); ok && isScheme(scheme) && rest != "" && !strings.Contains(rest, "@") {
		return scheme + ":" + Mask // sqlite:FILE, mailto:..., an opaque URL
	}
	return Mask
}

// isScheme reports whether s is a URL scheme.
func isScheme(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case i > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return true
}

// isKeyValue reports whether s looks like a key=value DSN: its first word is a
// key followed by '='.
func isKeyValue(s string) bool {
	s = strings.TrimLeft(s, " \t\n")
	k, _, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return false
	}
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// keyValue masks the values of a key=value DSN (libpq's syntax: values may
// be single-quoted, with backslash escapes) except those of KeptKeys. Text
// that does not parse is masked from there on.
func keyValue(s string) string {
	return keyValueShow(s, func(key, value string) bool { return kept(key) && plain(value) })
}

// keyValueShow is keyValue that shows the values show accepts.
func keyValueShow(s string, show func(key, value string) bool) string {
	var b strings.Builder
	for {
		trimmed := strings.TrimLeft(s, " \t\n")
		b.WriteString(s[:len(s)-len(trimmed)])
		s = trimmed
		if s == "" {
			return b.String()
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || strings.ContainsAny(s[:eq], " \t\n'\\") {
			b.WriteString(Mask)
			return b.String()
		}
		key := strings.TrimSpace(s[:eq])
		s = strings.TrimLeft(s[eq+1:], " \t\n")
		value, rest, ok := cutValue(s)
		if !ok {
			b.WriteString(key + "=" + Mask)
			return b.String()
		}
		if show(key, value) {
			b.WriteString(key + "=" + value)
		} else {
			b.WriteString(key + "=" + Mask)
		}
		s = rest
	}
}

// cutValue splits the value at the start of s from the rest: a single-quoted
// value with its quotes, or a run of characters up to white space.
func cutValue(s string) (value, rest string, ok bool) {
	if !strings.HasPrefix(s, "'") {
		i := strings.IndexAny(s, " \t\n")
		if i < 0 {
			return s, "", true
		}
		return s[:i], s[i:], true
	}
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '\'':
			return s[:i+1], s[i+1:], true
		}
	}
	return "", "", false
}

// plain reports whether a kept value is a plain host, port, name or number,
// which cannot be part of a misparsed secret.
func plain(v string) bool {
	if v == "" {
		return false
	}
	for _, c := range v {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._-:,[]", c)) {
			return false
		}
	}
	return true
}

func kept(key string) bool {
	for _, k := range KeptKeys {
		if strings.EqualFold(k, key) {
			return true
		}
	}
	return false
}

// Secrets returns the parts of dsn that String masks and that are long
// enough to be searched for in other text (a driver's error may quote the
// database name or a query parameter): the password, the path and its
// segments, query values, the fragment and masked key=value values, each in
// its raw and decoded form. Scrub uses them.
func Secrets(dsn string) []string {
	var out []string
	add := func(vs ...string) {
		for _, v := range vs {
			v = strings.Trim(v, "/'")
			if len(v) >= minSecret && !strings.Contains(Mask, v) {
				out = append(out, v)
			}
		}
	}
	switch {
	case dsn == "":
		return nil
	case strings.Contains(dsn, "://"):
		u, err := url.Parse(dsn)
		if err != nil {
			_, rest, _ := strings.Cut(dsn, "://")
			add(rest)
			return out
		}
		if p, ok := u.User.Password(); ok {
			add(p)
			if raw := u.User.String(); strings.Contains(raw, ":") {
				_, rp, _ := strings.Cut(raw, ":")
				add(rp)
			}
		}
		add(u.Path, u.RawPath, u.EscapedPath(), u.Opaque, u.RawQuery, u.Fragment, u.RawFragment)
		for _, seg := range strings.Split(u.Path, "/") {
			add(seg)
		}
		for k, vs := range u.Query() {
			if !kept(k) {
				add(vs...)
			}
		}
		for _, part := range strings.Split(u.RawQuery, "&") {
			if k, v, _ := strings.Cut(part, "="); !kept(k) {
				add(v)
			}
		}
	case isKeyValue(dsn):
		s := dsn
		for {
			s = strings.TrimLeft(s, " \t\n")
			key, after, ok := strings.Cut(s, "=")
			if !ok {
				add(s)
				break
			}
			value, rest, ok := cutValue(strings.TrimLeft(after, " \t\n"))
			if !ok {
				add(after)
				break
			}
			if !kept(strings.TrimSpace(key)) {
				add(value, strings.ReplaceAll(value, `\'`, `'`))
			}
			s = rest
			if strings.TrimSpace(s) == "" {
				break
			}
		}
	default:
		if scheme, rest, ok := strings.Cut(dsn, ":"); ok && isScheme(scheme) {
			add(rest)
			file, query, _ := strings.Cut(rest, "?")
			add(file, query)
			for _, seg := range strings.Split(file, "/") {
				add(seg)
			}
			return out
		}
		add(dsn)
		for _, seg := range strings.Split(dsn, "/") {
			add(seg)
		}
	}
	return out
}

// minSecret is the shortest part Secrets returns: shorter ones (a one-letter
// database name) would mask common words of unrelated text.
const minSecret = 4

// Scrub returns text with every secret of the dsns (see Secrets) replaced by
// Mask, longest first, so that a driver's error quoting a password, database
// name or query value prints none of them.
func Scrub(text string, dsns ...string) string {
	var secrets []string
	for _, d := range dsns {
		secrets = append(secrets, Secrets(d)...)
	}
	return replaceLongestFirst(text, secrets)
}

// replaceLongestFirst replaces every secret in text with Mask.
func replaceLongestFirst(text string, secrets []string) string {
	// Longest first, so that a secret containing another is replaced whole.
	for i := 1; i < len(secrets); i++ {
		for j := i; j > 0 && len(secrets[j]) > len(secrets[j-1]); j-- {
			secrets[j], secrets[j-1] = secrets[j-1], secrets[j]
		}
	}
	for _, s := range secrets {
		text = strings.ReplaceAll(text, s, Mask)
	}
	return text
}

// URLError masks the URL of every *url.Error in err's chain, in place, so
// that err prints no secret of the URL it failed on (net/http quotes the
// whole request URL). It returns err. Call it before wrapping err:
// fmt.Errorf formats its message at once.
func URLError(err error) error {
	for e := err; e != nil; {
		var ue *url.Error
		if !errors.As(e, &ue) {
			break
		}
		if u, perr := url.Parse(ue.URL); perr == nil {
			ue.URL = URL(u)
		} else {
			ue.URL = String(ue.URL)
		}
		e = ue.Err
	}
	return err
}
