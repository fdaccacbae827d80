package bwprobe

import (
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"time"
)

// A shaped link, for tests under testing/synctest: bytes written to one end come out of
// the other at a set rate, a set latency later, as a path with a bottleneck of that rate
// and that one-way delay would deliver them. Shaping is in user space, on virtual time, so
// a result does not depend on the machine's speed.

// linkChunk is the most bytes one delivery carries: about a TCP send of ten segments.
const linkChunk = 16 << 10

// linkQueue is how many chunks may be on their way or waiting to be read (1 MiB): the
// flow-control window of the path. A writer past it blocks.
const linkQueue = 64

type delivery struct {
	data []byte
	at   time.Time // when its last byte arrives
}

// half is one direction of a link.
type half struct {
	rate    func() float64 // bytes per second, read at each chunk: the test may change it
	latency time.Duration
	jitter  float64    // each chunk's time on the wire varies by up to ± this share
	rng     *rand.Rand // used by the writer only
	q       chan delivery

	mu            sync.Mutex
	readDeadline  time.Time
	writeDeadline time.Time
	closed        bool

	pending []byte // the rest of a delivery a read did not take; the reader's only
}

func newHalf(rate func() float64, latency time.Duration, jitter float64, seed uint64) *half {
	return &half{rate: rate, latency: latency, jitter: jitter, rng: rand.New(rand.NewPCG(seed, 1)), q: make(chan delivery, linkQueue)}
}

// write sends p, chunk by chunk: each takes its time on the wire (rate, with jitter), then
// travels latency.
func (h *half) write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), linkChunk)
		wire := float64(k) / h.rate() * (1 + h.jitter*(2*h.rng.Float64()-1))
		time.Sleep(time.Duration(wire * float64(time.Second)))
		d := delivery{data: append([]byte(nil), p[:k]...), at: time.Now().Add(h.latency)}
		h.mu.Lock()
		deadline, closed := h.writeDeadline, h.closed
		h.mu.Unlock()
		if closed {
			return n, io.ErrClosedPipe
		}
		if err := sendBy(h.q, d, deadline); err != nil {
			return n, err
		}
		n, p = n+k, p[k:]
	}
	return n, nil
}

func sendBy(q chan delivery, d delivery, deadline time.Time) error {
	if deadline.IsZero() {
		q <- d
		return nil
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case q <- d:
		return nil
	case <-t.C:
		return os.ErrDeadlineExceeded
	}
}

// read returns what has arrived, waiting for the next delivery if nothing has.
func (h *half) read(p []byte) (int, error) {
	if len(h.pending) == 0 {
		h.mu.Lock()
		deadline := h.readDeadline
		h.mu.Unlock()
		var expired <-chan time.Time
		if !deadline.IsZero() {
			t := time.NewTimer(time.Until(deadline))
			defer t.Stop()
			expired = t.C
		}
		select {
		case d, ok := <-h.q:
			if !ok {
				return 0, io.EOF
			}
			if wait := time.Until(d.at); wait > 0 {
				time.Sleep(wait) // still on its way
			}
			h.pending = d.data
		case <-expired:
			return 0, os.ErrDeadlineExceeded
		}
	}
	n := copy(p, h.pending)
	h.pending = h.pending[n:]
	return n, nil
}

// closeWrite ends the direction: the reader reads EOF after what is on its way.
func (h *half) closeWrite() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		close(h.q)
	}
}

// end is one end of a link: it reads from one half and writes to the other.
type end struct{ in, out *half }

func (e end) Read(p []byte) (int, error)  { return e.in.read(p) }
func (e end) Write(p []byte) (int, error) { return e.out.write(p) }
func (e end) Close() error                { e.out.closeWrite(); return nil }

func (e end) SetDeadline(t time.Time) error {
	e.SetReadDeadline(t)
	e.out.mu.Lock()
	e.out.writeDeadline = t
	e.out.mu.Unlock()
	return nil
}

func (e end) SetReadDeadline(t time.Time) error {
	e.in.mu.Lock()
	e.in.readDeadline = t
	e.in.mu.Unlock()
	return nil
}

// newLink returns the two ends of a link: a's writes reach b at rate ab() and b's reach a
// at ba(), each latency later (one way), each chunk's time on the wire varying by up to
// ±jitter.
func newLink(ab, ba func() float64, latency time.Duration, jitter float64, seed uint64) (a, b end) {
	x := newHalf(ab, latency, jitter, seed)
	y := newHalf(ba, latency, jitter, seed+1)
	return end{in: y, out: x}, end{in: x, out: y}
}
