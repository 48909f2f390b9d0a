package redisdedup

import (
	"strings"
	"testing"
)

// parseRedisKey inverts RedisKey: it returns the scope and key a Redis key
// name was built from, or false if name is not of RedisKey's form.
func parseRedisKey(prefix, name string) (scope, key string, ok bool) {
	rest, ok := strings.CutPrefix(name, prefix+"{")
	if !ok || !strings.HasSuffix(rest, "}") {
		return "", "", false
	}
	rest = rest[:len(rest)-1]
	escScope, escKey, ok := strings.Cut(rest, ":")
	if !ok || strings.ContainsAny(escScope, "{}") || strings.Contains(escKey, "}") {
		return "", "", false
	}
	scope, ok1 := unescape(escScope)
	key, ok2 := unescape(escKey)
	return scope, key, ok1 && ok2
}

// unescape undoes the %XX escapes of RedisKey.
func unescape(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		switch s[i+1 : i+3] {
		case "25":
			b.WriteByte('%')
		case "3A":
			b.WriteByte(':')
		case "7B":
			b.WriteByte('{')
		case "7D":
			b.WriteByte('}')
		default:
			return "", false
		}
		i += 2
	}
	return b.String(), true
}

// FuzzRedisKey checks that RedisKey is injective: its name decodes back to
// the one (scope, key) pair it was built from, and its Cluster hash tag spans
// both, so that the keys of one scope and key always share a slot.
func FuzzRedisKey(f *testing.F) {
	for _, p := range [][2]string{
		{"orders", "1"}, {"orders:eu", "1"}, {"orders", "eu:1"}, {"a%3A", "b"}, {"a:", "b"}, {"{", "}"},
		{"", ""}, {"%", "%"}, {"}", "{"}, {"a}b", "c{d}"}, {"%7D", "%25"}, {"x\x00", "\xff"},
	} {
		f.Add(p[0], p[1], "idemq:")
	}
	f.Add("s", "k", "")
	f.Add("s", "k", "app:prod:")
	f.Fuzz(func(t *testing.T, scope, key, prefix string) {
		if strings.ContainsAny(prefix, "{}") {
			return // rejected by Config.validate
		}
		s := &Store{cfg: Config{Prefix: prefix}}
		name := s.RedisKey(scope, key)
		gotScope, gotKey, ok := parseRedisKey(prefix, name)
		if !ok || gotScope != scope || gotKey != key {
			t.Fatalf("RedisKey(%q, %q) = %q decodes to (%q, %q, %v)", scope, key, name, gotScope, gotKey, ok)
		}
		// The hash tag is the text between the first '{' and the next '}';
		// it must cover the whole escaped scope and key.
		open := strings.IndexByte(name, '{')
		closing := strings.IndexByte(name[open+1:], '}')
		if open != len(prefix) || open+1+closing != len(name)-1 {
			t.Fatalf("hash tag of %q does not span scope and key", name)
		}
		if len(name) > len(prefix)+3*(len(scope)+len(key))+3 {
			t.Fatalf("RedisKey of %d bytes from %d", len(name), len(prefix)+len(scope)+len(key))
		}
		// A second pair derived from the first never collides with it.
		for _, other := range [][2]string{{scope + ":" + key, ""}, {scope, key + "}"}, {scope + "%", key}, {key, scope}} {
			if other[0] == scope && other[1] == key {
				continue
			}
			if s.RedisKey(other[0], other[1]) == name {
				t.Fatalf("(%q, %q) and (%q, %q) map to %q", scope, key, other[0], other[1], name)
			}
		}
	})
}

// FuzzRedisKeyPairs checks injectivity on two independent pairs.
func FuzzRedisKeyPairs(f *testing.F) {
	f.Add("orders:eu", "1", "orders", "eu:1")
	f.Add("a", "b}", "a", "b%7D")
	f.Add("a%", "b", "a%25", "b")
	f.Add("", ":", ":", "")
	f.Fuzz(func(t *testing.T, s1, k1, s2, k2 string) {
		s := &Store{cfg: Config{Prefix: DefaultPrefix}}
		if (s1 != s2 || k1 != k2) && s.RedisKey(s1, k1) == s.RedisKey(s2, k2) {
			t.Fatalf("(%q, %q) and (%q, %q) map to one key %q", s1, k1, s2, k2, s.RedisKey(s1, k1))
		}
	})
}
