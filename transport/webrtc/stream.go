package webrtc

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/pion/datachannel"
)

// Stream is one bidirectional data channel to a peer. It carries bytes, like a libp2p
// stream: framing is the user's job. Read and Write may be called concurrently with each
// other and with the other methods; concurrent Reads (or Writes) are serialized.
type Stream interface {
	io.Reader
	io.Writer
	// CloseWrite ends the write side: the remote reads io.EOF after every byte written
	// before. Read goes on.
	CloseWrite() error
	// Close ends the stream gracefully: the remote reads everything written, then io.EOF.
	// It does not wait for delivery; the data goes out unless the PeerConnection closes
	// first (the stream holds its PeerConnection open, until the remote closes too or
	// drainTimeout). Later Reads and Writes fail.
	Close() error
	// Reset ends the stream abruptly: the remote's Read fails with ErrReset (not io.EOF)
	// after the data sent before, and so do its Writes after that read.
	Reset() error
	// SetReadDeadline makes a Read pending at t, or called after it, fail with
	// os.ErrDeadlineExceeded (Timeout() is true). The zero time means no deadline.
	SetReadDeadline(t time.Time) error
	// SetWriteDeadline does the same for Write: a Write blocked by flow control past t
	// fails with os.ErrDeadlineExceeded, having written some of its bytes.
	SetWriteDeadline(t time.Time) error
}

// ErrReset is the error of a stream reset by either side, or broken because its
// PeerConnection failed or closed.
var ErrReset = errors.New("webrtc stream reset")

// errStreamClosed is the error of Read or Write after a local Close (or Write after
// CloseWrite).
var errStreamClosed = fmt.Errorf("webrtc stream: %w", net.ErrClosed)

// Data channel message types: the first byte of every message.
const (
	msgData  byte = 0x00
	msgFin   byte = 0x01
	msgReset byte = 0x02
)

const (
	// maxMessage bounds a data channel message, type byte included, in bytes. 16 KiB is
	// the size every WebRTC implementation delivers whole (RFC 8831 §6.6) and the size
	// go-libp2p's WebRTC streams use.
	maxMessage = 16 << 10
	// sendHighWater: Write blocks while more than this many bytes of the stream are queued
	// in SCTP, not yet acknowledged. 1 MiB keeps a 10 ms path busy at 800 Mbit/s and bounds
	// what one stream makes its sender hold.
	sendHighWater = 1 << 20
	// sendLowWater: a blocked Write resumes when the queue drains to this, so it refills in
	// large steps rather than a message at a time.
	sendLowWater = sendHighWater / 2
	// drainTimeout bounds how long a closed or reset stream goes on reading (and
	// discarding) what the remote still sends, waiting for the remote to close its side:
	// unread data would hold the receive window every stream of the PeerConnection shares.
	drainTimeout = 10 * time.Second
)

// stream is a Stream on a detached pion data channel.
type stream struct {
	c  *peerConn
	dc *datachannel.DataChannel

	readMu sync.Mutex // one Read at a time
	rbuf   []byte     // the message being read, maxMessage bytes once allocated

	writeMu sync.Mutex // one Write at a time, so a Write's messages stay in order
	wbuf    []byte     // a message being written

	// writable is signalled when a blocked Write should look again: the send queue fell
	// to sendLowWater, the write deadline changed or the stream ended.
	writable chan struct{}

	mu            sync.Mutex
	rpend         []byte     // payload of the last data message not yet returned by Read
	reading       bool       // a Read is in the channel's ReadDataChannel
	readIdle      *sync.Cond // on mu: signalled when reading turns false
	readErr       error      // sticky: io.EOF after fin, ErrReset, errStreamClosed
	writeErr      error      // sticky: errStreamClosed after fin sent, ErrReset
	readDeadline  time.Time
	readTimer     *time.Timer // wakes a Read blocked at readDeadline
	writeDeadline time.Time
	ended         bool // Close or Reset called, or the PeerConnection closed

	releaseOnce sync.Once
	released    chan struct{} // closed when the stream has ended and left its PeerConnection

	// incoming is set when the remote opened the stream; scope is its reservation in the
	// host's resource manager (nil: none), ended once by done.
	incoming  bool
	scope     network.StreamManagementScope
	scopeDone sync.Once
}

// done ends the stream's resource-manager reservation, if it has one.
func (s *stream) done() {
	s.scopeDone.Do(func() {
		if s.scope != nil {
			s.scope.Done()
		}
	})
}

func newStream(c *peerConn, dc *datachannel.DataChannel) *stream {
	s := &stream{c: c, dc: dc, writable: make(chan struct{}, 1), released: make(chan struct{})}
	s.readIdle = sync.NewCond(&s.mu)
	dc.SetBufferedAmountLowThreshold(sendLowWater)
	// Called by SCTP's read loop holding its locks: it only signals.
	dc.OnBufferedAmountLow(s.notifyWritable)
	return s
}

func (s *stream) notifyWritable() {
	select {
	case s.writable <- struct{}{}:
	default:
	}
}

// CloseWrite sends fin.
func (s *stream) CloseWrite() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writeErr != nil {
		return nil
	}
	s.writeErr = errStreamClosed
	s.notifyWritable()
	// Queued in SCTP after every data message: writes hold mu while queueing.
	if _, err := s.dc.WriteDataChannel([]byte{msgFin}, false); err != nil {
		return fmt.Errorf("send fin: %w", err)
	}
	return nil
}

// Close sends fin unless sent, then ends the stream.
func (s *stream) Close() error {
	err := s.CloseWrite()
	s.end()
	return err
}

// Reset sends reset unless fin was sent, then ends the stream.
func (s *stream) Reset() error {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return nil
	}
	var err error
	if s.writeErr == nil {
		s.writeErr = ErrReset
		_, err = s.dc.WriteDataChannel([]byte{msgReset}, false)
	}
	if s.readErr == nil {
		s.readErr = ErrReset
	}
	s.mu.Unlock()
	s.end()
	if err != nil {
		return fmt.Errorf("send reset: %w", err)
	}
	return nil
}

// end closes the data channel (SCTP resets the outgoing stream after what is queued) and
// hands it to the drain, which releases the stream from its PeerConnection.
func (s *stream) end() {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	if s.readErr == nil {
		s.readErr = errStreamClosed
	}
	if s.writeErr == nil {
		s.writeErr = errStreamClosed
	}
	s.stopReadTimerLocked()
	s.mu.Unlock()
	s.notifyWritable()
	s.dc.Close()
	s.wakeReader() // a Read blocked in the channel returns readErr
	if !s.c.t.goAsync(s.drain) {
		s.release()
	}
}

// drain reads and discards what the remote still sends until it closes its side (its
// reset of the SCTP stream reads as io.EOF), the PeerConnection closes or drainTimeout
// passes; then it releases the stream.
func (s *stream) drain() {
	defer s.release()
	// A Read in the channel leaves it, woken by end; none enters after end.
	s.mu.Lock()
	for s.reading {
		s.readIdle.Wait()
	}
	s.mu.Unlock()
	var expired atomic.Bool
	timer := time.AfterFunc(drainTimeout, func() {
		expired.Store(true)
		s.wakeReader()
	})
	defer timer.Stop()
	buf := make([]byte, maxMessage)
	s.dc.SetReadDeadline(time.Time{}) // clears end's wake-up
	for {
		_, _, err := s.dc.ReadDataChannel(buf)
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded) && !expired.Load():
			s.dc.SetReadDeadline(time.Time{}) // a wake-up meant for the Read: read on
		case errors.Is(err, io.ErrShortBuffer):
			s.c.t.goAsync(func() { s.c.close(errBadPeer) })
			return
		default:
			return
		}
	}
}

// shutdown ends the stream because its PeerConnection closes.
func (s *stream) shutdown(err error) {
	s.mu.Lock()
	s.ended = true
	if s.readErr == nil {
		s.readErr = err
	}
	if s.writeErr == nil {
		s.writeErr = err
	}
	s.stopReadTimerLocked()
	s.mu.Unlock()
	s.notifyWritable()
	s.wakeReader()
	s.release()
}

// wakeReader makes a pending ReadDataChannel return os.ErrDeadlineExceeded at once, and
// later ones until the deadline is cleared. pion only ever gets such past deadlines or
// none: its timer goroutine of a deadline can lose the cancel channel of the next one set
// right after it fires, and a future deadline would then keep its goroutine to the end.
func (s *stream) wakeReader() {
	s.dc.SetReadDeadline(time.Now().Add(-time.Hour))
}

func (s *stream) stopReadTimerLocked() {
	if s.readTimer != nil {
		s.readTimer.Stop()
		s.readTimer = nil
	}
}

func (s *stream) release() {
	s.releaseOnce.Do(func() {
		s.c.release(s)
		close(s.released)
	})
}
