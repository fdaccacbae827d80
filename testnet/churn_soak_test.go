//go:build soak

package testnet

import (
	"testing"
	"time"
)

// TestChurnSoak is docs/reliability.md F19 as the catalogue states it: a peer joins or
// leaves every 2 s for 2 min, among 2-6 serving peers, with TestChurn's assertions. Beyond
// the short version it runs twelve times as long, so that a leak per event (a request that
// never ends, a reputation entry never forgotten) has 60 events to show, and Retain (5 s)
// is longer than the churn's period: the router remembers several peers that left at once.
func TestChurnSoak(t *testing.T) {
	runChurn(t, churnPlan{Every: 2 * time.Second, For: 2 * time.Minute, MinPeers: 2, MaxPeers: 6,
		Streams: 4, Retain: 5 * time.Second, Cap: 32})
}
