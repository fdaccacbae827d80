package mux

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	logging "github.com/ipfs/go-log/v2"
	"github.com/libp2p/go-libp2p/core/network"
)

var log = logging.Logger("transport/mux")

var (
	errDeadline    = os.ErrDeadlineExceeded
	errWriteClosed = fmt.Errorf("mux stream: write side closed: %w", net.ErrClosed)
	errReadClosed  = fmt.Errorf("mux stream: read side closed: %w", net.ErrClosed)
)

// stream is one stream of a Conn. Read and Write may be called concurrently with each
// other and with the other methods; concurrent Writes are serialized.
type stream struct {
	c  *Conn
	id uint32

	writeMu sync.Mutex // one Write at a time, so that its frames go out in order

	mu        sync.Mutex
	buf       []byte // received, not yet read: buf[off:]
	off       int
	recvAvail uint32 // bytes the remote may still send before more credit
	consumed  uint32 // bytes read since the last credit sent
	sendAvail uint32 // bytes this side may still send
	finRecv   bool   // the remote's FIN arrived: EOF once buf is read
	readErr   error  // sticky: reset, local CloseRead
	writeErr  error  // sticky: FIN sent, reset
	broken    error  // the connection closed: Read fails once buf is read, Write at once
	rdl, wdl  time.Time
	ended     bool // forgotten by the connection
	slot      bool // holds a slot of c.unacked: opened here, the remote's ACK not seen
	sending   int  // frames of Write being written (reserved credit, lock not yet left)
	sent      *sync.Cond

	// queued: waiting for AcceptStream (under c.mu).
	queued bool
	// closeBy: UnixNano after which a stream closed here without the remote's FIN is reset
	// by the connection's janitor; 0 when not closed.
	closeBy atomic.Int64

	readable chan struct{} // signalled on data, end of the read side, deadline change
	writable chan struct{} // signalled on credit, end of the write side, deadline change
}

var _ network.MuxedStream = (*stream)(nil)

func newStream(c *Conn, id uint32) *stream {
	s := &stream{
		c: c, id: id,
		recvAvail: Window, sendAvail: Window,
		readable: make(chan struct{}, 1), writable: make(chan struct{}, 1),
	}
	s.sent = sync.NewCond(&s.mu)
	return s
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// wait blocks until ch is signalled or deadline (when set) passes; it reports false at the
// deadline. timer is reused across waits of one call.
func wait(ch chan struct{}, deadline time.Time, timer **time.Timer) bool {
	if deadline.IsZero() {
		<-ch
		return true
	}
	d := time.Until(deadline)
	if d <= 0 {
		return false
	}
	if *timer == nil {
		*timer = time.NewTimer(d)
	} else {
		(*timer).Reset(d)
	}
	select {
	case <-ch:
		return true
	case <-(*timer).C:
		return false
	}
}

// await waits for ch; it reports false when deadline passed and *current (s.rdl or s.wdl,
// read under s.mu) still holds it, true on a signal or a deadline since moved.
func (s *stream) await(ch chan struct{}, deadline time.Time, current *time.Time, timer **time.Timer) bool {
	if wait(ch, deadline, timer) {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return !current.Equal(deadline)
}

func stopTimer(t *time.Timer) {
	if t != nil {
		t.Stop()
	}
}

// Read reads received bytes: io.EOF after the remote's FIN, a *network.StreamError after a
// reset.
func (s *stream) Read(b []byte) (int, error) {
	var timer *time.Timer
	defer func() { stopTimer(timer) }()
	for {
		s.mu.Lock()
		switch {
		case s.readErr != nil:
			err := s.readErr
			s.mu.Unlock()
			return 0, err
		case s.off < len(s.buf):
			n := copy(b, s.buf[s.off:])
			s.off += n
			if s.off == len(s.buf) {
				s.buf, s.off = s.buf[:0], 0
			}
			var grant uint32
			s.consumed += uint32(n)
			if s.consumed >= Window/2 && !s.finRecv {
				grant, s.consumed = s.consumed, 0
				s.recvAvail += grant
			}
			s.mu.Unlock()
			if grant > 0 {
				// A failure here is the connection's: the next Read reports it.
				s.c.writeFrame(s, typeWindow, 0, grant, nil, time.Time{})
			}
			return n, nil
		case s.finRecv:
			s.mu.Unlock()
			return 0, io.EOF
		case s.broken != nil:
			err := s.broken
			s.mu.Unlock()
			return 0, err
		case len(b) == 0:
			s.mu.Unlock()
			return 0, nil
		}
		deadline := s.rdl
		s.mu.Unlock()
		if !s.await(s.readable, deadline, &s.rdl, &timer) {
			return 0, errDeadline
		}
	}
}

// Write sends b in frames of at most MaxPayload bytes, each as soon as the remote's credit
// allows, in the caller's goroutine.
func (s *stream) Write(b []byte) (int, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	var timer *time.Timer
	defer func() { stopTimer(timer) }()
	n := 0
	for {
		s.mu.Lock()
		if err := cmp.Or(s.writeErr, s.broken); err != nil {
			s.mu.Unlock()
			return n, err
		}
		deadline := s.wdl
		if n == len(b) {
			s.mu.Unlock()
			return n, nil
		}
		if s.sendAvail == 0 {
			s.mu.Unlock()
			if !s.await(s.writable, deadline, &s.wdl, &timer) {
				return n, errDeadline
			}
			continue
		}
		k := min(uint32(len(b)-n), s.sendAvail, MaxPayload)
		s.sendAvail -= k
		s.sending++ // CloseWrite's FIN waits for this frame
		s.mu.Unlock()
		err := s.c.writeFrame(s, typeData, 0, k, b[n:n+int(k)], deadline)
		s.mu.Lock()
		if s.sending--; s.sending == 0 {
			s.sent.Broadcast()
		}
		if err != nil {
			s.sendAvail += k // not sent
			s.mu.Unlock()
			return n, err
		}
		s.mu.Unlock()
		n += int(k)
	}
}

// CloseWrite sends FIN: the remote reads io.EOF after everything written before, a frame
// a concurrent Write is sending included (one waiting for credit fails instead).
func (s *stream) CloseWrite() error {
	s.mu.Lock()
	if s.writeErr != nil {
		s.mu.Unlock()
		return nil
	}
	s.writeErr = errWriteClosed
	for s.sending > 0 {
		s.sent.Wait()
	}
	s.mu.Unlock()
	signal(s.writable)
	err := s.c.writeFrame(s, typeWindow, flagFIN, 0, nil, time.Time{})
	s.maybeEnd()
	return err
}

// CloseRead stops reading: buffered and later data is discarded (and credited back).
func (s *stream) CloseRead() error {
	s.mu.Lock()
	if s.readErr != nil {
		s.mu.Unlock()
		return nil
	}
	s.readErr = errReadClosed
	unread := uint32(len(s.buf) - s.off)
	s.buf, s.off = nil, 0
	grant := unread + s.consumed
	s.consumed = 0
	s.recvAvail += grant
	fin := s.finRecv
	s.mu.Unlock()
	signal(s.readable)
	if grant > 0 && !fin {
		s.c.control(typeWindow, 0, s.id, grant)
	}
	s.maybeEnd()
	return nil
}

// Close ends both sides gracefully. If the remote has not sent FIN within the close
// timeout, the connection's janitor resets the stream.
func (s *stream) Close() error {
	err := s.CloseWrite()
	s.CloseRead()
	s.closeBy.CompareAndSwap(0, time.Now().Add(s.c.closeTimeout).UnixNano())
	return err
}

// Reset ends the stream abruptly: the remote's Read and Write fail with ErrReset.
func (s *stream) Reset() error { return s.ResetWithError(network.StreamNoError) }

// ResetWithError resets with code, which the remote's errors carry.
func (s *stream) ResetWithError(code network.StreamErrorCode) error {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return nil
	}
	s.setErrs(&network.StreamError{ErrorCode: code})
	s.mu.Unlock()
	s.wake()
	err := s.c.writeFrame(s, typeWindow, flagRST, uint32(code), nil, time.Time{})
	s.end()
	return err
}

// setErrs ends both sides with err, unless ended already (a local CloseRead or FIN stays);
// s.mu held. Unread data is dropped.
func (s *stream) setErrs(err error) {
	if s.readErr == nil {
		s.readErr = err
	}
	if s.writeErr == nil {
		s.writeErr = err
	}
	s.buf, s.off = nil, 0
}

func (s *stream) wake() {
	signal(s.readable)
	signal(s.writable)
}

// receive appends a data frame's payload (called by the receive loop).
func (s *stream) receive(p []byte) error {
	s.mu.Lock()
	n := uint32(len(p))
	if n > s.recvAvail {
		s.mu.Unlock()
		return violation("stream %d: %d bytes beyond a credit of %d", s.id, n, s.recvAvail)
	}
	s.recvAvail -= n
	switch {
	case s.finRecv || s.ended:
		// After FIN or a reset: dropped.
	case errors.Is(s.readErr, errReadClosed):
		s.recvAvail += n
		s.mu.Unlock()
		if n > 0 {
			s.c.control(typeWindow, 0, s.id, n)
		}
		return nil
	case s.readErr != nil || s.broken != nil:
	default:
		if s.off > 0 && s.off >= len(s.buf)/2 {
			s.buf, s.off = s.buf[:copy(s.buf, s.buf[s.off:])], 0
		}
		s.buf = append(s.buf, p...)
		s.mu.Unlock()
		signal(s.readable)
		return nil
	}
	s.mu.Unlock()
	return nil
}

// credit adds the remote's grant to the send window.
func (s *stream) credit(n uint32) error {
	s.mu.Lock()
	if uint64(s.sendAvail)+uint64(n) > maxCredit {
		s.mu.Unlock()
		return violation("stream %d: credit over %d", s.id, maxCredit)
	}
	s.sendAvail += n
	s.mu.Unlock()
	if n > 0 {
		signal(s.writable)
	}
	return nil
}

// remoteFin ends the read side at the end of what arrived.
func (s *stream) remoteFin() {
	s.mu.Lock()
	s.finRecv = true
	s.mu.Unlock()
	signal(s.readable)
	s.maybeEnd()
}

// remoteReset ends both sides with the remote's code.
func (s *stream) remoteReset(code network.StreamErrorCode) {
	s.mu.Lock()
	s.setErrs(&network.StreamError{ErrorCode: code, Remote: true})
	s.mu.Unlock()
	s.wake()
	s.end()
}

// abort ends the stream because the connection closed: what arrived can still be read.
func (s *stream) abort(err error) {
	s.mu.Lock()
	s.broken = err
	s.ended = true
	s.mu.Unlock()
	s.releaseSlot()
	s.wake()
}

// maybeEnd forgets the stream once both sides have ended: this side's FIN sent (or reset)
// and the remote's FIN received (or this side stopped reading and the remote... still
// may send: then the stream stays until its FIN, a reset or the close timeout).
func (s *stream) maybeEnd() {
	s.mu.Lock()
	done := s.writeErr != nil && s.finRecv
	s.mu.Unlock()
	if done {
		s.end()
	}
}

// end forgets the stream.
func (s *stream) end() {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	s.mu.Unlock()
	s.releaseSlot()
	s.c.forget(s)
}

// releaseSlot frees the stream's slot among the unacknowledged, if it holds one.
func (s *stream) releaseSlot() {
	s.mu.Lock()
	held := s.slot
	s.slot = false
	s.mu.Unlock()
	if held {
		<-s.c.unacked
	}
}

// SetDeadline sets both deadlines.
func (s *stream) SetDeadline(t time.Time) error {
	s.SetReadDeadline(t)
	return s.SetWriteDeadline(t)
}

// SetReadDeadline makes a pending or later Read fail with os.ErrDeadlineExceeded at t.
func (s *stream) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	s.rdl = t
	s.mu.Unlock()
	signal(s.readable)
	return nil
}

// SetWriteDeadline makes a Write blocked on credit or on the connection fail at t.
func (s *stream) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	s.wdl = t
	s.mu.Unlock()
	signal(s.writable)
	return nil
}
