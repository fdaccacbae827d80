package transport

import (
	"net"
	"net/http"
	"time"
)

// HTTPLimits bound what clients can hold of one of the node's HTTP servers: the API (with
// the coordinator's gateway on its listener, transport/openai) and the console
// (node/console). Each server states its own values and their reasons; the header's two,
// below, are the same for both (SharedHTTPLimits).
//
// Against a slow client (slowloris: a connection that sends its request a byte at a time,
// or nothing at all) a server has a deadline for every wait: the header, the whole request,
// the next request on a kept-alive connection. Against many connections, each within those
// deadlines, it has the per-client cap. What one client can hold is then ConnsPerIP
// connections, each for at most ReadHeaderTimeout before its header is complete.
type HTTPLimits struct {
	// ReadHeaderTimeout bounds reading a request's header: from the connection's opening for
	// its first request, from the first bytes of the next one on a kept-alive connection. It
	// is one deadline for the whole header, not one per read, so trickling bytes does not
	// extend it.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, header and body, from the same start.
	ReadTimeout time.Duration
	// IdleTimeout closes a kept-alive connection that waits this long for its next request.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's header (request line included); a larger one gets
	// 431. net/http reads up to about 8 KiB past it (its buffers' slack) before refusing.
	MaxHeaderBytes int
	// ConnsPerIP bounds the connections one client (an IPv4 address, an IPv6 /64) holds at
	// once, kept-alive and upgraded (WebSocket) ones included; the one over it is closed on
	// arrival (PerIPListener). ≤ 0: no cap.
	ConnsPerIP int
}

// Values both servers use.
const (
	// ReadHeaderTimeout is HTTPLimits.ReadHeaderTimeout for every server: a header is a few
	// hundred bytes, which any link delivers in well under a second; 5 s is inside the
	// header deadline docs/reliability.md's F4 asks of every protocol (10 s).
	ReadHeaderTimeout = 5 * time.Second
	// MaxHeaderBytes is HTTPLimits.MaxHeaderBytes for every server, in bytes: nginx's default
	// for a request's header lines (4 buffers of 8 KiB). Requests to these servers carry an
	// API key and a few preference headers; the rest is room for the cookies every program
	// on localhost shares (browsers scope cookies by host, not port). net/http's default is
	// 1 MiB, which ConnsPerIP connections would each be allowed to buffer.
	MaxHeaderBytes = 32 << 10
)

// SharedHTTPLimits are the limits every server has (the header's); each sets the rest.
func SharedHTTPLimits() HTTPLimits {
	return HTTPLimits{ReadHeaderTimeout: ReadHeaderTimeout, MaxHeaderBytes: MaxHeaderBytes}
}

// Server returns an http.Server serving h with l's deadlines and header bound. The caller
// sets any other field before serving it.
func (l HTTPLimits) Server(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
}

// Listener returns ln with l's per-client cap (LimitPerIP).
func (l HTTPLimits) Listener(ln net.Listener) *PerIPListener { return LimitPerIP(ln, l.ConnsPerIP) }
