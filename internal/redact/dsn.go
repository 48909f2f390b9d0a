package redact

import (
	"net/url"
	"strings"
)

// secretWords mark a query parameter or key=value key whose value DSN hides:
// a key whose lower-cased name contains one of them (password, sslpassword,
// token, sslkey, secret_key, auth, X-Amz-Signature...).
var secretWords = []string{"pass", "pwd", "secret", "token", "key", "auth", "cred", "sig", "session"}

// SecretKey reports whether the values of the query parameter or key=value
// key named key are hidden by DSN and ScrubDSN.
func SecretKey(key string) bool {
	k := strings.ToLower(key)
	for _, w := range secretWords {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
}

// DSN returns s, a database DSN or a broker URL that the user typed, with
// its password and the values of its secret parameters (see SecretKey)
// masked, and everything else as written: the database name, a file path,
// a virtual host and the other parameters help the user see what went wrong
// ("database orders does not exist"). Text that does not parse as a URL,
// key=value DSN or file path, and text with user information it cannot
// separate ("u:pw@tcp(h)/d"), is masked as String masks it. Use String or
// URL for URLs whose path itself may be a credential (webhooks).
func DSN(s string) string {
	switch {
	case s == "":
		return ""
	case strings.Contains(s, "://"):
		u, err := url.Parse(s)
		if err != nil {
			return String(s)
		}
		var b strings.Builder
		b.WriteString(u.Scheme + "://")
		if u.User != nil {
			b.WriteString(url.PathEscape(u.User.Username()))
			if _, ok := u.User.Password(); ok {
				b.WriteString(":" + Mask)
			}
			b.WriteByte('@')
		}
		b.WriteString(u.Host)
		b.WriteString(u.EscapedPath())
		if u.RawQuery != "" || u.ForceQuery {
			b.WriteString("?" + query(u.RawQuery))
		}
		if u.Fragment != "" || u.RawFragment != "" {
			b.WriteString("#" + Mask)
		}
		return b.String()
	case isKeyValue(s):
		return keyValueShow(s, func(key, value string) bool { return !SecretKey(key) })
	case strings.Contains(s, "@"):
		return String(s)
	}
	// sqlite:FILE, a bare file path, with its query's secrets masked.
	file, q, ok := strings.Cut(s, "?")
	if !ok {
		return s
	}
	return file + "?" + query(q)
}

// query masks the values of a raw query's secret parameters.
func query(raw string) string {
	parts := strings.Split(raw, "&")
	for i, p := range parts {
		k, _, hasValue := strings.Cut(p, "=")
		name, err := url.QueryUnescape(k)
		if err != nil {
			name = k
		}
		if hasValue && SecretKey(name) {
			parts[i] = k + "=" + Mask
		}
	}
	return strings.Join(parts, "&")
}

// DSNSecrets returns what DSN masks in dsn, in raw and decoded forms, that is
// long enough to be searched for in other text: the password and the values
// of secret parameters. ScrubDSN uses them.
func DSNSecrets(dsn string) []string {
	var out []string
	add := func(vs ...string) {
		for _, v := range vs {
			v = strings.Trim(v, "'")
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
			return Secrets(dsn)
		}
		if p, ok := u.User.Password(); ok {
			add(p)
			if _, rp, ok := strings.Cut(u.User.String(), ":"); ok {
				add(rp)
			}
		}
		add(u.Fragment, u.RawFragment)
		add(querySecrets(u.RawQuery)...)
	case isKeyValue(dsn):
		s := dsn
		for {
			s = strings.TrimLeft(s, " \t\n")
			key, after, ok := strings.Cut(s, "=")
			if !ok {
				break
			}
			value, rest, ok := cutValue(strings.TrimLeft(after, " \t\n"))
			if !ok {
				if SecretKey(strings.TrimSpace(key)) {
					add(after)
				}
				break
			}
			if SecretKey(strings.TrimSpace(key)) {
				add(value, strings.ReplaceAll(value, `\'`, `'`))
			}
			s = rest
			if strings.TrimSpace(s) == "" {
				break
			}
		}
	case strings.Contains(dsn, "@"):
		return Secrets(dsn)
	default:
		if _, q, ok := strings.Cut(dsn, "?"); ok {
			add(querySecrets(q)...)
		}
	}
	return out
}

// querySecrets returns the raw and decoded values of a raw query's secret
// parameters.
func querySecrets(raw string) []string {
	var out []string
	for _, p := range strings.Split(raw, "&") {
		k, v, _ := strings.Cut(p, "=")
		name, err := url.QueryUnescape(k)
		if err != nil {
			name = k
		}
		if !SecretKey(name) {
			continue
		}
		out = append(out, v)
		if d, err := url.QueryUnescape(v); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// ScrubDSN returns text with every secret of the dsns (see DSNSecrets)
// replaced by Mask, longest first: a driver's error that quotes a password
// prints none, and one that quotes a database name or a file path prints it.
func ScrubDSN(text string, dsns ...string) string {
	var secrets []string
	for _, d := range dsns {
		secrets = append(secrets, DSNSecrets(d)...)
	}
	return replaceLongestFirst(text, secrets)
}
