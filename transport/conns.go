package transport

import (
	"errors"
	"net"
	"net/netip"
	"sync"
)

// PerIPListener is a net.Listener that holds at most a fixed number of connections from one
// client at a time: the bound on what a single host can take of an HTTP server's
// connections (slowloris: many connections, each trickling a request). A client is an IPv4
// address, or an IPv6 /64: one host's share, since a host is usually given a whole /64 and
// could otherwise use a fresh address per connection. A connection whose address is not an
// IP (a pipe, a Unix socket) counts under one shared client.
//
// A connection over the cap is closed at once, before anything is read from it or written
// to it, and Accept goes on to the next: the client sees its connection closed (EOF or a
// reset) without a response. Nothing more is possible at this layer: the API may run TLS
// above it, and answering 503 over HTTP would mean reading the request, which is what a
// slow client holds on to. Loopback is not exempt: on a loopback listener every client is
// this machine, and the cap bounds what one local program (or a web page a browser runs)
// can hold.
type PerIPListener struct {
	net.Listener
	max int

	mu      sync.Mutex
	conns   map[netip.Prefix]int // open connections by client; no zero entries
	open    int
	refused uint64
}

// LimitPerIP wraps ln so that it holds at most max connections per client; max ≤ 0 means no
// cap (connections are still counted).
func LimitPerIP(ln net.Listener, max int) *PerIPListener {
	return &PerIPListener{Listener: ln, max: max, conns: make(map[netip.Prefix]int)}
}

// Accept waits for the next connection within its client's cap. Connections over the cap
// are closed and counted (Refused) without returning.
func (l *PerIPListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := clientOf(c.RemoteAddr())
		if !l.acquire(key) {
			c.Close()
			continue
		}
		return &limitedConn{Conn: c, release: sync.OnceFunc(func() { l.release(key) })}, nil
	}
}

// Open is the number of connections handed out and not yet closed.
func (l *PerIPListener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Refused is the number of connections closed on arrival because their client was at its
// cap.
func (l *PerIPListener) Refused() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refused
}

func (l *PerIPListener) acquire(key netip.Prefix) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.max > 0 && l.conns[key] >= l.max {
		l.refused++
		return false
	}
	l.conns[key]++
	l.open++
	return true
}

func (l *PerIPListener) release(key netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns[key]--; l.conns[key] <= 0 {
		delete(l.conns, key)
	}
	l.open--
}

// clientOf is the client a remote address counts under: its IPv4 address (an IPv4-mapped
// IPv6 address is the IPv4 one) or its IPv6 /64, and the zero Prefix for anything else.
func clientOf(a net.Addr) netip.Prefix {
	var ip netip.Addr
	switch a := a.(type) {
	case *net.TCPAddr:
		ip = a.AddrPort().Addr()
	default:
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return netip.Prefix{}
		}
		ip = ap.Addr()
	}
	ip = ip.Unmap().WithZone("")
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, err := ip.Prefix(bits)
	if err != nil { // an invalid Addr
		return netip.Prefix{}
	}
	return p
}

// limitedConn gives its client's place back on its first Close.
type limitedConn struct {
	net.Conn
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// CloseWrite half-closes the connection when it can: net/http shuts a connection's write
// side before closing it after an error response, so that the client reads the response
// instead of a reset.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
