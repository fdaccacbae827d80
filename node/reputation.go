package node

import (
	"context"
	"time"

	"github.com/meshinfer/meshinfer/reputation"
)

// pruneReputation prunes rep every period until ctx ends: the store has no clock and no
// goroutine of its own (reputation's package doc), and without a caller of Prune a peer
// that left stays in it until the cap evicts it, however long ago it left. The time is the
// node's clock, so Retain counts on it.
func pruneReputation(ctx context.Context, rep *reputation.Store, now func() time.Time, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rep.Prune(now())
	}
}
