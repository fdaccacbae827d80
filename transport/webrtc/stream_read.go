package webrtc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// Read reads the stream's bytes: io.EOF after the remote's fin, ErrReset after its reset
// or when the channel ends without either.
func (s *stream) Read(b []byte) (int, error) {
	s.readMu.Lock()
	defer s.readMu.Unlock()
	for {
		s.mu.Lock()
		switch {
		case s.ended:
			err := s.readErr
			s.mu.Unlock()
			return 0, err
		case len(s.rpend) > 0:
			n := copy(b, s.rpend)
			s.rpend = s.rpend[n:]
			s.mu.Unlock()
			return n, nil
		case s.readErr != nil:
			err := s.readErr
			s.mu.Unlock()
			return 0, err
		case !s.readDeadline.IsZero() && !time.Now().Before(s.readDeadline):
			s.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		case len(b) == 0:
			s.mu.Unlock()
			return 0, nil
		}
		s.reading = true
		s.mu.Unlock()
		if s.rbuf == nil {
			s.rbuf = make([]byte, maxMessage)
		}
		n, isString, err := s.dc.ReadDataChannel(s.rbuf)
		if err == nil {
			err = s.receive(s.rbuf[:n], isString)
		} else {
			err = s.readFailed(err)
		}
		s.mu.Lock()
		s.reading = false
		s.readIdle.Broadcast()
		s.mu.Unlock()
		if err != nil {
			return 0, err
		}
	}
}

// readFailed turns an error of the data channel into the stream's, or nil when the read
// should be tried again.
func (s *stream) readFailed(err error) error {
	s.mu.Lock()
	if s.readErr != nil { // ended while reading
		defer s.mu.Unlock()
		return s.readErr
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		expired := !s.readDeadline.IsZero() && !time.Now().Before(s.readDeadline)
		s.mu.Unlock()
		if expired {
			return os.ErrDeadlineExceeded
		}
		// A wake-up for a deadline since moved: clear it and read on.
		s.dc.SetReadDeadline(time.Time{})
		return nil
	}
	if errors.Is(err, io.ErrShortBuffer) {
		s.mu.Unlock()
		// A message over maxMessage stays at the head of the channel for ever; only closing
		// the PeerConnection frees what it holds.
		s.c.t.goAsync(func() { s.c.close(errBadPeer) })
		return fmt.Errorf("%w: message over %d bytes", ErrReset, maxMessage)
	}
	// io.EOF: the remote closed the channel without fin or reset (pion then closes ours);
	// anything else: the association broke.
	s.readErr = fmt.Errorf("%w: data channel ended without fin: %w", ErrReset, err)
	if s.writeErr == nil {
		s.writeErr = s.readErr
	}
	err = s.readErr
	s.mu.Unlock()
	s.notifyWritable()
	return err
}

// receive takes one message: data becomes rpend; fin and reset end the read side.
func (s *stream) receive(msg []byte, isString bool) error {
	if isString || len(msg) == 0 || (msg[0] != msgData && len(msg) != 1) {
		return s.violation("malformed message")
	}
	switch msg[0] {
	case msgData:
		s.mu.Lock()
		s.rpend = msg[1:]
		s.mu.Unlock()
		return nil
	case msgFin:
		s.mu.Lock()
		if s.readErr == nil {
			s.readErr = io.EOF
		}
		err := s.readErr
		s.mu.Unlock()
		return err
	case msgReset:
		s.mu.Lock()
		if s.readErr == nil {
			s.readErr = fmt.Errorf("%w by the remote", ErrReset)
		}
		if s.writeErr == nil {
			s.writeErr = s.readErr
		}
		err := s.readErr
		s.mu.Unlock()
		s.notifyWritable()
		return err
	}
	return s.violation(fmt.Sprintf("message type %#x", msg[0]))
}

// violation resets the stream the remote broke the protocol on.
func (s *stream) violation(what string) error {
	log.Debugw("data channel protocol violation", "peer", s.c.peer, "err", what)
	err := fmt.Errorf("%w: protocol violation: %s", ErrReset, what)
	s.mu.Lock()
	if s.readErr == nil {
		s.readErr = err
	}
	s.mu.Unlock()
	s.Reset()
	return err
}

// SetReadDeadline sets the deadline of Read. A timer wakes a Read blocked in the channel
// when it passes (see wakeReader).
func (s *stream) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	s.readDeadline = t
	s.stopReadTimerLocked()
	wake := false
	if !t.IsZero() && !s.ended {
		if d := time.Until(t); d > 0 {
			s.readTimer = time.AfterFunc(d, s.wakeReader)
		} else {
			wake = true
		}
	}
	s.mu.Unlock()
	if wake {
		s.wakeReader()
	}
	return nil
}
