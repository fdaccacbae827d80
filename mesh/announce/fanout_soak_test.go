//go:build soak

package announce

import (
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
)

// TestAnnouncementFanOutL5Soak is L5 as the catalogue writes it: 50 nodes announcing every
// 10 s for 10 virtual minutes, at most 6 (D) duplicates per delivery (fanout_test.go has
// the setup and what is counted).
func TestAnnouncementFanOutL5Soak(t *testing.T) {
	fanoutCase(t, "50 nodes, 10 virtual min", fanoutConfig{
		Nodes: 50, Duration: 10 * time.Minute, Heartbeat: 10 * time.Second,
		Warmup: 20 * time.Second, Drain: 5 * time.Second, Dials: 3, MaxDup: float64(pubsub.GossipSubD),
	})
}
