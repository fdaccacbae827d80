package bandwidth

import (
	"io"
	"time"
)

// MinBytes is the smallest transfer that is a sample: 64 KiB. Below it a transfer's time is
// mostly per-message costs (framing, a scheduler's wake-up, the first congestion window),
// not the link's rate.
const MinBytes = 64 << 10

// MaxRate bounds a sample's rate, in bytes per second: 1 Tbit/s, the capability vector's
// bound on an announced downlink. A reading above it is a clock's oddity, not a link.
const MaxRate = 1e12 / 8

// Direction says which way a transfer went, as this node sees it.
type Direction int

const (
	// Down: this node received the bytes from the peer.
	Down Direction = iota
	// Up: the peer received the bytes from this node.
	Up
)

// Transfer is one timed transfer between this node and a peer.
type Transfer struct {
	Dir Direction
	// Bytes is every byte of the transfer; Timed those Dur covers: all but the bytes of
	// the first read, which had arrived when the timing began.
	Bytes, Timed int64
	// Dur is the time from the first byte read to the last (for Up, from the first byte
	// sent to the peer's acknowledgement, less a round trip).
	Dur time.Duration
	// Waited is the part of Dur the reader spent waiting in reads; the rest it spent on its
	// own work between them.
	Waited time.Duration
}

// Rate is the transfer's rate in bytes per second, and whether it is a sample (the package
// doc): at least MinBytes, timed over some time, paced by the link rather than the reader
// (Waited at least half of Dur), and within MaxRate.
func (t Transfer) Rate() (float64, bool) {
	if t.Dir != Down && t.Dir != Up || t.Bytes < MinBytes || t.Timed <= 0 || t.Dur <= 0 || 2*t.Waited < t.Dur {
		return 0, false
	}
	r := float64(t.Timed) / t.Dur.Seconds()
	if r > MaxRate {
		return 0, false
	}
	return r, true
}

// Meter times the bytes read through it, one transfer at a time: Take returns what was
// read since the previous Take. Put it under the reader of a stream (beneath any buffering)
// and call Take after each transfer (a frame, an answer), and before one when the stream
// carried something else since. It measures durations on the monotonic clock (time.Now),
// as the deadlines of the streams it reads are: under testing/synctest, virtual time.
//
// A Meter is used by one goroutine at a time, as the reader it wraps is.
type Meter struct {
	r            io.Reader
	bytes, timed int64
	first, last  time.Time
	waited       time.Duration
}

// NewMeter returns a Meter reading from r.
func NewMeter(r io.Reader) *Meter { return &Meter{r: r} }

// Read reads from the underlying reader and notes when the bytes came and how long the
// read waited for them.
func (m *Meter) Read(p []byte) (int, error) {
	start := time.Now()
	n, err := m.r.Read(p)
	if n > 0 {
		end := time.Now()
		if m.bytes == 0 {
			// The first bytes of a transfer: the timing starts when they came, and they
			// are not timed (they arrived at some time before, unknown).
			m.first = end
		} else {
			m.timed += int64(n)
			m.waited += end.Sub(start)
		}
		m.bytes += int64(n)
		m.last = end
	}
	return n, err
}

// Take returns the transfer read since the previous Take (or NewMeter), as Down, and
// starts the next one.
func (m *Meter) Take() Transfer {
	t := Transfer{Dir: Down, Bytes: m.bytes, Timed: m.timed, Dur: m.last.Sub(m.first), Waited: m.waited}
	*m = Meter{r: m.r}
	return t
}
