package redact

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

const secret = "s3cr3tPl4nt"

func TestString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://app:" + secret + "@db.internal:5432/orders?sslmode=disable", "postgres://app:xxxxx@db.internal:5432/xxxxx?xxxxx"},
		{"postgres://app@127.0.0.1/" + secret, "postgres://app@127.0.0.1/xxxxx"},
		{"postgresql://h/db?password=" + secret, "postgresql://h/xxxxx?xxxxx"},
		{"https://hooks.example/T0/" + secret + "?token=" + secret + "#" + secret, "https://hooks.example/xxxxx?xxxxx#xxxxx"},
		{"http://127.0.0.1:8080", "http://127.0.0.1:8080"},
		{"http://127.0.0.1:8080/", "http://127.0.0.1:8080/"},
		{"sqlite:/var/lib/" + secret + ".db", "sqlite:xxxxx"},
		{"sqlite:///tmp/" + secret + ".db", "sqlite:///xxxxx"},
		{"/tmp/" + secret + ".db", "xxxxx"},
		{"host=db port=5432 user=app password=" + secret + " dbname=" + secret, "host=db port=5432 user=app password=xxxxx dbname=xxxxx"},
		{"host=db password='a " + secret + ` \' b' sslmode=require`, "host=db password=xxxxx sslmode=require"},
		{"password='unterminated " + secret, "password=xxxxx"},
		{"mysql://u:" + secret + "@tcp(h:3306)/d", "mysql://xxxxx"},
		{"u:" + secret + "@tcp(h)/d", "xxxxx"},
		{"", ""},
	} {
		got := String(tc.in)
		if got != tc.want {
			t.Errorf("String(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, secret) {
			t.Errorf("String(%q) = %q shows the secret", tc.in, got)
		}
	}
}

func TestScrub(t *testing.T) {
	dsn := "postgres://app:" + secret + "@127.0.0.1:1/" + secret + "db?application_name=" + secret + "app"
	text := fmt.Sprintf("failed to connect to `user=app database=%sdb`: password %s; app %sapp", secret, secret, secret)
	got := Scrub(text, dsn)
	if strings.Contains(got, secret) {
		t.Fatalf("Scrub left the secret: %q", got)
	}
	if !strings.Contains(got, "user=app") {
		t.Fatalf("Scrub masked more than the secrets: %q", got)
	}
	kv := "host=h user=app password='" + secret + "x' dbname=" + secret + "y"
	if got := Scrub("db "+secret+"y pw "+secret+"x", kv); strings.Contains(got, secret) {
		t.Fatalf("Scrub(key=value) left the secret: %q", got)
	}
	if got := Scrub("user app on host h, sslmode disable", "postgres://app:pw@h/d?sslmode=disable"); got != "user app on host h, sslmode disable" {
		t.Fatalf("Scrub masked short parts: %q", got)
	}
}

func TestURLError(t *testing.T) {
	raw := "http://user:" + secret + "@127.0.0.1:1/hooks/" + secret + "?token=" + secret
	_, err := http.Get(raw)
	if err == nil {
		t.Fatal("no error from a closed port")
	}
	wrapped := fmt.Errorf("webhook: %w", URLError(err))
	if strings.Contains(wrapped.Error(), secret) {
		t.Fatalf("URLError left the secret: %v", wrapped)
	}
	var ue *url.Error
	if !errors.As(wrapped, &ue) || ue.URL != "http://user:xxxxx@127.0.0.1:1/xxxxx?xxxxx" {
		t.Fatalf("URL error %v lost its type or host", wrapped)
	}
	if URLError(nil) != nil {
		t.Fatal("URLError(nil) != nil")
	}
}

// FuzzString checks that no password, path, query or masked value of a URL
// or key=value DSN survives String, and that String is idempotent.
func FuzzString(f *testing.F) {
	f.Add("postgres", "app", "db.internal:5432", "orders", "sslmode=disable")
	f.Add("https", "", "h", "T0/B1", "token=abc")
	f.Add("sqlite", "", "", "x.db", "")
	f.Fuzz(func(t *testing.T, scheme, user, host, path, query string) {
		u := &url.URL{Scheme: scheme, Host: host, Path: "/" + path + secret, RawQuery: query + secret}
		if user != "" {
			u.User = url.UserPassword(user, secret)
		}
		raw := u.String()
		got := String(raw)
		if strings.Contains(got, secret) {
			t.Fatalf("String(%q) = %q shows the secret", raw, got)
		}
		if again := String(got); strings.Contains(again, secret) {
			t.Fatalf("String twice shows the secret: %q", again)
		}
		kv := "host=" + strings.ReplaceAll(host, " ", "") + " password='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(path+secret) + "' dbname=" + secret
		if got := String(kv); strings.Contains(got, secret) {
			t.Fatalf("String(%q) = %q shows the secret", kv, got)
		}
	})
}
