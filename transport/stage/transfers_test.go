package stage

import (
	"sync"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/internal/bandwidth"
)

// transferLog records the transfers a side was told of.
type transferLog struct {
	mu   sync.Mutex
	from []peer.ID
	tr   []bandwidth.Transfer
}

func (l *transferLog) add(p peer.ID, t bandwidth.Transfer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.from, l.tr = append(l.from, p), append(l.tr, t)
}

func (l *transferLog) get() ([]peer.ID, []bandwidth.Transfer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]peer.ID(nil), l.from...), append([]bandwidth.Transfer(nil), l.tr...)
}

// Each side is told of every step's frame it read, from the peer that sent it, metered
// alone: the prefill step's frame is one transfer of its bytes (a sample's size), each
// decode step's another, far smaller. Stage 0 hears of the head's frames, stage 1 of
// stage 0's, the head of stage 1's output.
func TestStepFramesAreMetered(t *testing.T) {
	const layers, width, promptLen, decode = 4, 256, 128, 3
	prefill := int64(4 * width * promptLen) // the values alone; the frame has a few bytes more
	logs := []*transferLog{{}, {}}
	c := chain{head: newHost(t)}
	for i, r := range [][2]int{{0, 2}, {2, 4}} {
		n := newStage(t, newArith(layers, width, 8), WithServerTransfers(logs[i].add))
		know(c.head, n.h)
		c.stages = append(c.stages, n)
		c.hops = append(c.hops, Hop{Peer: n.h.ID(), Lo: r[0], Hi: r[1]})
	}
	var head transferLog
	p := c.open(t, 256, WithPipelineTransfers(head.add))
	if _, err := generate(t.Context(), p.Forward, width, promptStates(promptLen, width), decode); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range c.stages {
		c.stages[i].freed(t, OutcomeClosed)
	}
	senders := []peer.ID{c.head.ID(), c.stages[0].h.ID()}
	for i, side := range []*transferLog{logs[0], logs[1], &head} {
		want := c.head.ID()
		switch i {
		case 1:
			want = senders[1]
		case 2:
			want = c.stages[1].h.ID()
		}
		from, trs := side.get()
		if len(trs) != 1+decode {
			t.Fatalf("side %d told of %d frames, want %d", i, len(trs), 1+decode)
		}
		for k, tr := range trs {
			if from[k] != want {
				t.Fatalf("side %d frame %d from %s, want %s", i, k, from[k], want)
			}
			if tr.Dir != bandwidth.Down || tr.Timed > tr.Bytes || tr.Waited > tr.Dur {
				t.Fatalf("side %d frame %d: %+v", i, k, tr)
			}
		}
		if b := trs[0].Bytes; b < prefill || b > prefill+1024 || b < bandwidth.MinBytes {
			t.Fatalf("side %d: the prefill frame metered as %d bytes, want its %d bytes and a header", i, b, prefill)
		}
		for k, tr := range trs[1:] {
			if tr.Bytes >= bandwidth.MinBytes || tr.Bytes < 4*width {
				t.Fatalf("side %d: decode frame %d metered as %d bytes, want its %d and a header", i, k+1, tr.Bytes, 4*width)
			}
		}
	}
}
