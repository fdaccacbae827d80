package announce

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/internal/window"
)

// oldShapeLogEvery is how often at most the validator warns about one peer that announces
// vectors in the caps/1 shape: such a peer sends one every heartbeat, and one line per ten
// minutes is enough to tell the operator which peer must upgrade.
const oldShapeLogEvery = 10 * time.Minute

// oldShapeLogCap bounds the peers remembered. When it is reached and none of them is due
// again, a new peer's warning is dropped: the peers already named tell the story.
const oldShapeLogCap = 1024

// oldShapeLog warns, at most once per peer every oldShapeLogEvery, that a peer announces an
// old (caps/1) capability vector. The zero value is ready for use.
type oldShapeLog struct {
	mu   sync.Mutex
	last window.Keyed[peer.ID] // when each peer was last warned about

	logged atomic.Uint64 // warnings written
}

// note records that author's vector, handed over by via, was refused with err for its caps/1
// shape, and logs a warning when author is due one at now.
func (l *oldShapeLog) note(author, via peer.ID, err error, now time.Time) {
	if !l.due(author, now) {
		return
	}
	l.logged.Add(1)
	log.Warnw("peer announces an old capability vector (caps/1); it must upgrade meshinfer to be seen on caps/2",
		"peer", author, "via", via, "err", err)
}

func (l *oldShapeLog) due(author peer.ID, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last.Cap == 0 {
		l.last = window.Keyed[peer.ID]{Length: oldShapeLogEvery, Max: 1, Cap: oldShapeLogCap}
	}
	return l.last.Take(author, now)
}
