package amqpsource

import (
	"context"
	"net"
	"testing"
	"time"
)

// A server that accepts the TCP connection and never answers the AMQP
// handshake does not stall New: the dial gives up at ConnectTimeout, or
// earlier when New's context is done.
func TestNewAbandonsSilentServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	url := "amqp://guest:guest@" + ln.Addr().String() + "/"
	for _, c := range []struct {
		name    string
		timeout time.Duration // ConnectTimeout
		cancel  time.Duration // when New's context is cancelled
	}{
		{"ConnectTimeout", 300 * time.Millisecond, time.Hour},
		{"context", time.Hour, 300 * time.Millisecond},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), c.cancel)
		start := time.Now()
		_, err := New(ctx, Config{URL: url, Queue: "q", ConnectTimeout: c.timeout})
		cancel()
		if took := time.Since(start); err == nil || took > 5*time.Second {
			t.Errorf("%s: New returned %v after %s, want an error after about 300 ms", c.name, err, took)
		}
	}
}
