package testenv

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from a loopback port of its own to a
// service, so that a test can cut the service off or stall it without
// touching the shared service itself.
//
// A Proxy starts open. Cut closes every open connection and refuses new ones
// (they are accepted and closed at once, as a dead peer looks to a client).
// Stall keeps connections open but forwards no byte in either direction (as
// a hung server or a black-holed network looks), new connections included.
// Restore makes it forward again; what a stalled connection held back is then
// delivered. The methods are safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	state   proxyState
	resume  chan struct{} // closed when the proxy leaves the stalled state
	conns   map[net.Conn]struct{}
	dials   int // connections clients opened to the proxy
	closed  bool
	working sync.WaitGroup
}

type proxyState int

const (
	proxyOpen proxyState = iota
	proxyCut
	proxyStalled
)

// StartProxy starts a proxy to target (host:port) on a free port of
// 127.0.0.1. The proxy closes when the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: proxy to %s: %v", target, err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, resume: make(chan struct{})}
	p.working.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr returns the proxy's address, host:port on 127.0.0.1.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every connection through the proxy and refuses new ones until
// Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.leaveStall()
	p.state = proxyCut
	for c := range p.conns {
		_ = c.Close()
	}
}

// Stall stops forwarding bytes, on open and new connections alike, until
// Restore or Cut.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != proxyStalled {
		p.resume = make(chan struct{})
	}
	p.state = proxyStalled
}

// Dials returns how many connections clients have opened to the proxy so
// far, refused ones (while cut) included: a client that retries a cut
// service shows as Dials growing at its retry rate.
func (p *Proxy) Dials() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dials
}

// Restore forwards again: new connections reach the target, and stalled ones
// go on where they stopped.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.leaveStall()
	p.state = proxyOpen
}

// leaveStall wakes the stalled copies; p.mu is held.
func (p *Proxy) leaveStall() {
	if p.state == proxyStalled {
		close(p.resume)
	}
}

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.leaveStall()
	p.state = proxyCut
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.working.Wait()
}

func (p *Proxy) accept() {
	defer p.working.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.dials++
		if p.state == proxyCut || p.closed {
			p.mu.Unlock()
			_ = client.Close()
			continue
		}
		p.mu.Unlock()
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !p.track(client, server) {
			continue
		}
		p.working.Add(2)
		go p.copy(server, client)
		go p.copy(client, server)
	}
}

// track records both ends of a connection, or closes them when the proxy was
// cut meanwhile.
func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == proxyCut || p.closed {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// copy forwards src to dst chunk by chunk, holding each chunk while the proxy
// is stalled; when either side ends, both close.
func (p *Proxy) copy(dst, src net.Conn) {
	defer p.working.Done()
	defer p.forget(dst, src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitOpen() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitOpen blocks while the proxy is stalled; it reports whether the chunk
// may go on (false once the proxy is cut or closed).
func (p *Proxy) waitOpen() bool {
	for {
		p.mu.Lock()
		state, resume := p.state, p.resume
		p.mu.Unlock()
		switch state {
		case proxyOpen:
			return true
		case proxyCut:
			return false
		}
		<-resume
	}
}

func (p *Proxy) forget(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}
