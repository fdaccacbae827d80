package webrtc

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/pion/ice/v4"
)

// Remote ICE candidates steer where this node sends packets: ICE sends STUN connectivity
// checks to every candidate the remote gives, and DTLS and SCTP to the one that answers.
// So the remote's candidates are bounded and filtered, whether they come trickled
// (candidate messages) or embedded in its offer or answer (SDP a=candidate lines), see the
// package doc's Remote candidates.

// errRefusedCandidate is why one remote candidate is dropped (not a violation: the
// others may do).
var errRefusedCandidate = errors.New("remote candidate refused")

// ipv4Reserved is 240.0.0.0/4 (class E, which holds the limited broadcast address
// 255.255.255.255); ipv4ThisNet is 0.0.0.0/8, "this network", as a source only.
var (
	ipv4Reserved = netip.MustParsePrefix("240.0.0.0/4")
	ipv4ThisNet  = netip.MustParsePrefix("0.0.0.0/8")
)

// checkCandidate parses a remote candidate line ("candidate:…", with or without the
// "a=" of an SDP attribute) and reports whether this node may send to it: see usableAddr.
func checkCandidate(line string) error {
	line = strings.TrimPrefix(line, "a=")
	if !strings.HasPrefix(line, "candidate:") {
		return fmt.Errorf("%w: not a candidate line", errRefusedCandidate)
	}
	c, err := ice.UnmarshalCandidate(line)
	if err != nil {
		return fmt.Errorf("%w: %w", errRefusedCandidate, err)
	}
	if c.Port() == 0 {
		return fmt.Errorf("%w: port 0", errRefusedCandidate)
	}
	addr, err := netip.ParseAddr(c.Address())
	if err != nil {
		// pion takes a name ending in .local as an mDNS candidate; we disable mDNS.
		return fmt.Errorf("%w: %q is not an IP address", errRefusedCandidate, c.Address())
	}
	if !usableAddr(addr) {
		return fmt.Errorf("%w: address %v", errRefusedCandidate, addr)
	}
	return nil
}

// usableAddr reports whether a remote candidate's address is one this node may be sent to:
// not unspecified, not multicast (224.0.0.0/4 and ff00::/8, link-local multicast
// included), not IPv4 broadcast or the rest of the reserved 240.0.0.0/4, not 0.0.0.0/8,
// and not link-local unicast (169.254.0.0/16, which holds cloud metadata services, and
// fe80::/10). An IPv4-mapped IPv6 address is judged as the IPv4 one. Loopback and private
// addresses pass: two nodes on one machine, and LANs, use them.
func usableAddr(a netip.Addr) bool {
	a = a.Unmap()
	switch {
	case !a.IsValid(), a.IsUnspecified(), a.IsMulticast(), a.IsLinkLocalUnicast():
		return false
	case a.Is4() && (ipv4Reserved.Contains(a) || ipv4ThisNet.Contains(a)):
		return false
	}
	return true
}

// sanitizeSDP returns sdp without the candidate lines this node refuses (checkCandidate)
// and the number of candidate lines it had, refused ones included. More than budget
// candidate lines is a violation: the remote counts them with those it trickles, against
// MaxCandidates.
func sanitizeSDP(sdp string, budget int) (string, int, error) {
	if !strings.Contains(sdp, "a=candidate:") {
		return sdp, 0, nil
	}
	var b strings.Builder
	b.Grow(len(sdp))
	n := 0
	for rest := sdp; rest != ""; {
		line, after, _ := strings.Cut(rest, "\n")
		full := rest[:len(rest)-len(after)] // the line with its line ending
		rest = after
		if !strings.HasPrefix(line, "a=candidate:") {
			b.WriteString(full)
			continue
		}
		if n++; n > budget {
			return "", n, fmt.Errorf("%w: over %d candidates", errSignalMessage, MaxCandidates)
		}
		if err := checkCandidate(strings.TrimSuffix(line, "\r")); err != nil {
			log.Debugw("dropped a candidate of the remote's description", "err", err)
			continue
		}
		b.WriteString(full)
	}
	return b.String(), n, nil
}
