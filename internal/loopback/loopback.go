// Package loopback tells whether a host name names this machine: "localhost" or an address
// in 127.0.0.0/8 or ::1. The services that must stay on the machine (transport's listen
// check and its Host-header guard) and the thin clients that send a key only to this
// machine over plain HTTP (transport/gateway) ask it the same way.
//
// Like every package under internal/, it imports nothing of the project, only the standard
// library (testnet/deps_test.go enforces it).
package loopback

import (
	"net"
	"strings"
)

// Host reports whether host (a name or an IP address, IPv6 with or without brackets, no
// port) names this machine.
func Host(host string) bool {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
