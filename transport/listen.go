package transport

import (
	"errors"
	"fmt"
	"net"
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
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%w: %q", ErrNotLoopback, addr)
	}
	return nil
}
