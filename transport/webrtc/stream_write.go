package webrtc

import (
	"fmt"
	"os"
	"time"
)

// Write writes b as data messages of at most maxMessage bytes, blocking while the
// stream's SCTP send queue is above sendHighWater.
func (s *stream) Write(b []byte) (int, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	n := 0
	for {
		s.mu.Lock()
		if s.writeErr != nil {
			err := s.writeErr
			s.mu.Unlock()
			return n, err
		}
		deadline := s.writeDeadline
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			s.mu.Unlock()
			return n, os.ErrDeadlineExceeded
		}
		if len(b) == 0 {
			s.mu.Unlock()
			return n, nil
		}
		if s.dc.BufferedAmount() > sendHighWater {
			s.mu.Unlock()
			var expired <-chan time.Time
			if !deadline.IsZero() {
				if timer == nil {
					timer = time.NewTimer(time.Until(deadline))
				} else {
					timer.Reset(time.Until(deadline))
				}
				expired = timer.C
			}
			select {
			case <-s.writable:
			case <-expired:
			}
			continue
		}
		k := min(len(b), maxMessage-1)
		if s.wbuf == nil {
			s.wbuf = make([]byte, 0, maxMessage)
		}
		s.wbuf = append(append(s.wbuf[:0], msgData), b[:k]...)
		// Queued while holding mu, so fin or reset can never come between a Write's
		// messages (SCTP copies the message: wbuf is free again on return).
		_, err := s.dc.WriteDataChannel(s.wbuf, false)
		if err != nil {
			if s.writeErr == nil {
				s.writeErr = fmt.Errorf("%w: %w", ErrReset, err)
			}
			err = s.writeErr
			s.mu.Unlock()
			return n, err
		}
		s.mu.Unlock()
		n += k
		b = b[k:]
	}
}

// SetWriteDeadline sets the deadline of Write.
func (s *stream) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	s.writeDeadline = t
	s.mu.Unlock()
	s.notifyWritable()
	return nil
}
