package gateway

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/meshinfer/meshinfer/internal/loopback"
)

// ErrPlainHTTPKey refuses to send an API key in the clear: over http:// to a host that is
// not this machine, anyone on the path can read it and spend its quota.
var ErrPlainHTTPKey = errors.New("refusing to send the API key over plain http:// to another machine: use the coordinator's https:// URL (meshinfer node --tls-cert), or allow plain HTTP for a network you trust")

// CheckKeyTransport reports ErrPlainHTTPKey for a coordinator URL whose scheme is http and
// whose host is not loopback (localhost, 127.0.0.0/8, ::1). Thin clients call it before they
// send a key.
func CheckKeyTransport(baseURL string) error {
	u, err := url.Parse(baseURL)
	if err != nil {
		return fmt.Errorf("coordinator URL %q: %w", baseURL, err)
	}
	if !strings.EqualFold(u.Scheme, "http") {
		return nil
	}
	if loopback.Host(u.Hostname()) {
		return nil
	}
	return fmt.Errorf("%w (%s)", ErrPlainHTTPKey, u.Host)
}
