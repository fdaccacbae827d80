package transport

import (
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/meshinfer/meshinfer/internal/loopback"
)

// ErrNotLoopback marks a listen address that would expose a local-only service.
var ErrNotLoopback = errors.New("address is not loopback")

// CheckLoopback returns nil when addr (host:port) is a loopback address or "localhost", an
// error wrapping ErrNotLoopback for any other host (an empty host means every interface), and
// a parse error for a malformed addr. Local HTTP services (the API, the console) call it
// before listening, so nothing is exposed to the network by accident.
func CheckLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	if !loopback.Host(host) {
		return fmt.Errorf("%w: %q", ErrNotLoopback, addr)
	}
	return nil
}

// LoopbackHosts wraps the handler of a service listening on loopback: it serves only
// requests whose Host names this machine (localhost, a 127.0.0.0/8 address, ::1, with any
// port) and answers any other with 421 Misdirected Request. A web page can make a browser
// reach a loopback port under its own domain name by DNS rebinding (evil.example resolving
// to 127.0.0.1); the Host header still says evil.example, and that request is refused, so
// the page can read nothing of the node. A service exposed on purpose (--api-public,
// --console-public) is not wrapped.
func LoopbackHosts(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(r.Host); err == nil {
			host = h
		}
		if !loopback.Host(host) {
			http.Error(w, fmt.Sprintf("host %q is not this machine: this service answers on localhost or 127.0.0.1 only", r.Host),
				http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}
