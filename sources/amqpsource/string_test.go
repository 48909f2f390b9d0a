package amqpsource_test

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/idemq/idemq/sources/amqpsource"
)

// String names the broker, the virtual host and the queue for the Runner's
// start line, and never the user name or password of the URL.
func TestSourceString(t *testing.T) {
	raw := brokerURL(t)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	pass, _ := u.User.Password()
	q := newQueue(t, raw, classic, 0)
	src := newSource(t, amqpsource.Config{URL: raw, Queue: q})
	s, ok := any(src).(fmt.Stringer)
	if !ok {
		t.Fatal("*amqpsource.Source has no String method")
	}
	got := s.String()
	for _, want := range []string{"rabbitmq", u.Host, "vhost=/", "queue=" + q} {
		if !strings.Contains(got, want) {
			t.Errorf("String() = %q, lacks %q", got, want)
		}
	}
	for _, secret := range []string{u.User.Username() + ":", pass + "@"} {
		if strings.Contains(got, secret) {
			t.Errorf("String() = %q holds the URL's credentials", got)
		}
	}
}
