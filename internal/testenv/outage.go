package testenv

import (
	"net/url"
	"testing"
	"time"
)

// OutageReport is what CutFor observed of a client while its service was cut
// off behind a Proxy.
type OutageReport struct {
	// LateDials is the number of connections clients opened to the proxy
	// during the last window of the cut: a client that keeps probing the
	// service at a capped interval shows a few, one whose backoff grew
	// without bound shows none.
	LateDials int
	// Restored is when the proxy forwarded again.
	Restored time.Time
}

// CutFor cuts p, runs during (if not nil) while it is cut, waits until the cut
// has lasted d, counts the dials of its last window, and restores p.
func (p *Proxy) CutFor(t testing.TB, d, window time.Duration, during func()) OutageReport {
	t.Helper()
	start := time.Now()
	p.Cut()
	if during != nil {
		during()
	}
	time.Sleep(time.Until(start.Add(d - window)))
	before := p.Dials()
	time.Sleep(time.Until(start.Add(d)))
	late := p.Dials() - before
	p.Restore()
	return OutageReport{LateDials: late, Restored: time.Now()}
}

// WaitRecovery polls done until it reports true and returns the time since
// since; it fails t once bound has passed since since.
func WaitRecovery(t testing.TB, since time.Time, bound time.Duration, done func() bool) time.Duration {
	t.Helper()
	for !done() {
		if time.Since(since) > bound {
			t.Fatalf("not recovered %v after the dependency answered again (bound %v)", time.Since(since).Round(time.Millisecond), bound)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(since)
}

// ProxyURL starts a Proxy to the host of rawURL (a service URL such as
// DatabaseURL, AMQPURL, RedisURL or SQSEndpoint) and returns rawURL with
// its host replaced by the proxy's, and the proxy.
func ProxyURL(t testing.TB, rawURL string) (string, *Proxy) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil || u.Port() == "" {
		t.Fatalf("testenv: cannot proxy a service URL without host:port (%v)", err != nil)
	}
	p := StartProxy(t, u.Host)
	u.Host = p.Addr()
	return u.String(), p
}
