package redact

import (
	"strings"
	"testing"
)

// DSN hides the password and secret parameters, and keeps what the user
// needs to read an error: database name, file path, other parameters.
func TestDSN(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://app:" + secret + "@db.internal:5432/orders?sslmode=disable&sslpassword=" + secret, "postgres://app:xxxxx@db.internal:5432/orders?sslmode=disable&sslpassword=xxxxx"},
		{"postgresql://h/orders?password=" + secret + "&application_name=shop", "postgresql://h/orders?password=xxxxx&application_name=shop"},
		{"amqp://guest:" + secret + "@127.0.0.1:5672/vhost", "amqp://guest:xxxxx@127.0.0.1:5672/vhost"},
		{"http://127.0.0.1:9324/?X-Amz-Signature=" + secret, "http://127.0.0.1:9324/?X-Amz-Signature=xxxxx"},
		{"sqlite:/var/lib/shop.db", "sqlite:/var/lib/shop.db"},
		{"/tmp/shop.db", "/tmp/shop.db"},
		{"sqlite:shop.db?_pragma=busy_timeout(5000)&_auth_pass=" + secret, "sqlite:shop.db?_pragma=busy_timeout(5000)&_auth_pass=xxxxx"},
		{"host=db port=5432 user=app password=" + secret + " dbname=orders", "host=db port=5432 user=app password=xxxxx dbname=orders"},
		{"host=db password='a " + secret + ` \' b' sslmode=require`, "host=db password=xxxxx sslmode=require"},
		{"password='unterminated " + secret, "password=xxxxx"},
		{"mysql://u:" + secret + "@tcp(h:3306)/d", "mysql://xxxxx"},
		{"u:" + secret + "@tcp(h)/d", "xxxxx"},
		{"", ""},
	} {
		got := DSN(tc.in)
		if got != tc.want {
			t.Errorf("DSN(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, secret) {
			t.Errorf("DSN(%q) = %q shows the secret", tc.in, got)
		}
	}
}

func TestScrubDSN(t *testing.T) {
	dsn := "postgres://app:" + secret + "@127.0.0.1:1/ordersdb?sslpassword=" + secret + "x&application_name=shop"
	text := "failed to connect to `user=app database=ordersdb`: password " + secret + "; ssl " + secret + "x; app shop"
	got := ScrubDSN(text, dsn)
	if strings.Contains(got, secret) {
		t.Fatalf("ScrubDSN left the secret: %q", got)
	}
	if !strings.Contains(got, "database=ordersdb") || !strings.Contains(got, "app shop") {
		t.Fatalf("ScrubDSN masked more than the secrets: %q", got)
	}
}
