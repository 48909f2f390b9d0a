package testenv_test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testenv"
)

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip writes a line and reads its echo within wait.
func roundTrip(c net.Conn, r *bufio.Reader, wait time.Duration) (string, error) {
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	return r.ReadString('\n')
}

func TestProxy(t *testing.T) {
	p := testenv.StartProxy(t, echoServer(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if got, err := roundTrip(c, r, 5*time.Second); err != nil || got != "ping\n" {
		t.Fatalf("open: %q, %v", got, err)
	}

	p.Stall()
	if got, err := roundTrip(c, r, 200*time.Millisecond); err == nil {
		t.Fatalf("stalled: the echo %q came through", got)
	}
	p.Restore()
	// The stalled ping arrives now, then the next one.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "ping\n" {
		t.Fatalf("restored: held echo %q, %v", got, err)
	}
	if got, err := roundTrip(c, r, 5*time.Second); err != nil || got != "ping\n" {
		t.Fatalf("restored: %q, %v", got, err)
	}

	p.Cut()
	if got, err := roundTrip(c, r, 5*time.Second); err == nil {
		t.Fatalf("cut: the echo %q came through", got)
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err == nil {
		_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c2.Read(make([]byte, 1)); err == nil {
			t.Fatal("cut: a new connection was forwarded")
		}
		_ = c2.Close()
	}

	p.Restore()
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if got, err := roundTrip(c3, bufio.NewReader(c3), 5*time.Second); err != nil || got != "ping\n" {
		t.Fatalf("restored after cut: %q, %v", got, err)
	}
}
