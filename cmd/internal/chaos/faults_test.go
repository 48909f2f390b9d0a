package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/sinks/webhook"
)

// The receiver applies each key of the run's scope once, counts the
// repeats, and sets apart requests without the run's key.
func TestReceiverCountsRepeatsAndForeignKeys(t *testing.T) {
	r, err := startReceiver("idemq-chaos-x-lease", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	post := func(key string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, r.url, strings.NewReader(`{"n":1}`))
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set(webhook.DefaultKeyHeader, key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	post("idemq-chaos-x-lease:item-x-00001")
	post("idemq-chaos-x-lease:item-x-00001") // a repeat: applied once
	post("idemq-chaos-x-lease:item-x-00002")
	post("idemq-chaos-x-lease:poison-x-0")
	post("other-scope:item-x-00003")
	post("")
	requests, applied, extra, foreign := r.counts()
	if requests != 4 || applied != 3 || extra != 1 {
		t.Errorf("requests %d, applied %d, extra %d; want 4, 3, 1", requests, applied, extra)
	}
	if len(foreign) != 2 || foreign[0] != "other-scope:item-x-00003" || foreign[1] != "" {
		t.Errorf("foreign keys %q; want the other scope's and the empty one", foreign)
	}
}

// A request for a key the lease store holds as done is recorded with its
// arrival; outside a failover's window it fails the run.
func TestReceiverRecordsRequestsAfterDone(t *testing.T) {
	done := func(_ context.Context, key string) (bool, error) {
		switch key {
		case "item-x-00002":
			return true, nil
		case "item-x-00003":
			return false, errors.New("master down")
		}
		return false, nil
	}
	r, err := startReceiver("s", done)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	for _, k := range []string{"s:item-x-00001", "s:item-x-00002", "s:item-x-00003"} {
		req, _ := http.NewRequest(http.MethodPost, r.url, strings.NewReader(`{}`))
		req.Header.Set(webhook.DefaultKeyHeader, k)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	afterDone, unchecked := r.checks()
	if len(afterDone) != 1 || afterDone[0].key != "item-x-00002" || unchecked != 1 {
		t.Fatalf("after done %+v, unchecked %d; want item-x-00002 and 1", afterDone, unchecked)
	}

	s := &scenario{}
	at := afterDone[0].at
	s.outages = []outage{{from: at.Add(-time.Minute), to: at.Add(-leaseFor - time.Second)}}
	if s.nearOutage(at, leaseFor) {
		t.Error("a request more than a lease after the failover counted as its window")
	}
	s.outages = append(s.outages, outage{from: at.Add(-time.Minute), to: at.Add(-leaseFor + time.Second)})
	if !s.nearOutage(at, leaseFor) {
		t.Error("a request within a lease of the failover did not count as its window")
	}
}

// A worker that exited before its runner started counts as refused, not
// as a failure, only when it was started during a node fault's outage.
func TestSelfExitDuringOutageIsARefusedStart(t *testing.T) {
	s := &scenario{kind: "amqp"}
	exited := func() *proc {
		t.Helper()
		p, err := startProc("/bin/sh", []string{"-c", "echo refused >&2; exit 1"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		<-p.done
		return p
	}

	s.selfExit(0, exited())
	if s.res.selfExits != 1 || s.res.refusedStarts != 0 || len(s.res.failures) != 1 {
		t.Fatalf("outside an outage: self-exits %d, refused %d, failures %d; want 1, 0, 1", s.res.selfExits, s.res.refusedStarts, len(s.res.failures))
	}

	end := s.outageBegins()
	s.selfExit(0, exited())
	end()
	if s.res.selfExits != 1 || s.res.refusedStarts != 1 || len(s.res.failures) != 1 {
		t.Fatalf("inside an outage: self-exits %d, refused %d, failures %d; want 1, 1, 1", s.res.selfExits, s.res.refusedStarts, len(s.res.failures))
	}

	// A worker whose runner had started fails the run even inside an
	// outage: a running worker must ride out a broker restart.
	end = s.outageBegins()
	p, err := startProc("/bin/sh", []string{"-c", `echo '{"received":1}'; exit 1`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-p.done
	s.selfExit(1, p)
	end()
	if s.res.selfExits != 2 || s.res.refusedStarts != 1 {
		t.Fatalf("a running worker inside an outage: self-exits %d, refused %d; want 2, 1", s.res.selfExits, s.res.refusedStarts)
	}
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) {
		t.Fatalf("exit error %v", p.err)
	}
}

// Unknown faults are refused; a dry-run fault runs no script.
func TestFaultsDryRun(t *testing.T) {
	if _, err := newFaults("/nonexistent", []string{"kafka-nod"}); err == nil {
		t.Fatal("an unknown fault was accepted")
	}
	f, err := newFaults("/nonexistent/services.sh", []string{faultRabbitMQRestart, faultPostgresRestart})
	if err != nil {
		t.Fatal(err)
	}
	s := &scenario{kind: "amqp", phaseStart: time.Now()}
	ev := f.fire(t.Context(), s, faultRabbitMQRestart, rand.New(rand.NewPCG(1, 2)))
	if ev.err != nil || !ev.dry || ev.node != "rabbitmq" {
		t.Fatalf("dry run: %+v", ev)
	}
	if got := ev.String(); !strings.HasPrefix(got, "rabbitmq restarted ") || !strings.HasSuffix(got, "(dry run)") {
		t.Errorf("event %q", got)
	}
	// A fault that is no dry run runs the script, which is missing here.
	f.dry = map[string]bool{}
	if ev := f.fire(t.Context(), s, faultPostgresRestart, rand.New(rand.NewPCG(1, 2))); ev.err == nil {
		t.Fatal("a missing services script did not fail the fault")
	}
	if len(s.outages) != 2 || s.outages[0].to.IsZero() || s.outages[1].to.IsZero() {
		t.Errorf("outages %+v; want two ended spans", s.outages)
	}
}

func TestSameAddr(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"127.0.0.1:7001", "127.0.0.1:7001", true},
		{"localhost:7001", "127.0.0.1:7001", true},
		{"127.0.0.1:7001", "127.0.0.1:7002", false},
		{"", "", false},
	} {
		if got := sameAddr(c.a, c.b); got != c.want {
			t.Errorf("sameAddr(%q, %q) = %v", c.a, c.b, got)
		}
	}
}
