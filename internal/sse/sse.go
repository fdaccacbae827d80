// Package sse reads the data of an OpenAI-style server-sent event stream, the way
// chat-completion streams are read everywhere in meshinfer: from an upstream server
// (inference/upstream), from a node's API (the gateway, its Go client, `meshinfer chat`).
//
// The stream is lines ending in "\n" (a "\r" before it is dropped). A line "data:<payload>"
// carries one payload, one optional space after the colon not part of it; every data line
// is its own event (OpenAI's streams never continue one event's data over several lines).
// Other lines (blank, ":" comments, event:, id:, retry:) carry nothing. The payload [DONE]
// (surrounding spaces ignored) ends the stream: nothing after it is read.
//
// Invariants: a line is bounded (maxLine bytes) before it is held whole, so a peer that never
// ends a line costs at most that much memory; Reader and Split, the pull and the push form,
// give the same payloads for the same bytes (FuzzReaderSplit).
//
// Like every package under internal/, it imports nothing of the project, only the standard
// library (testnet/deps_test.go enforces it).
package sse

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// ErrTooLong is a line over the reader's maximum.
var ErrTooLong = errors.New("event line too long")

// ErrNoDone is a stream that ended (io.EOF from its reader) without [DONE].
var ErrNoDone = errors.New("stream ended without [DONE]")

var (
	dataField = []byte("data:")
	doneData  = []byte("[DONE]")
)

// data returns the payload of a data line (its end of line, "\n" or "\r\n", already cut off)
// and whether it is one.
func data(line []byte) ([]byte, bool) {
	payload, ok := bytes.CutPrefix(line, dataField)
	if !ok {
		return nil, false
	}
	return bytes.TrimPrefix(payload, []byte{' '}), true
}

// isDone reports whether payload is the end-of-stream marker.
func isDone(payload []byte) bool { return bytes.Equal(bytes.TrimSpace(payload), doneData) }

// Reader reads the payloads of a stream, one line at a time.
type Reader struct {
	sc   *bufio.Scanner
	max  int
	done bool
}

// NewReader reads the stream r, refusing lines of maxLine bytes or more ("\n" excluded): a
// line and its end must fit in maxLine bytes. Its buffer starts
// at 4 KiB and grows to maxLine only for a line that long.
func NewReader(r io.Reader, maxLine int) *Reader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, min(4<<10, maxLine)), maxLine)
	return &Reader{sc: sc, max: maxLine}
}

// Next returns the next payload, valid until the next call. It returns io.EOF once the
// stream said [DONE] (and at every call after), ErrNoDone when it ended without, an error
// matching ErrTooLong for a line over the maximum, or the error of reading.
func (r *Reader) Next() ([]byte, error) {
	if r.done {
		return nil, io.EOF
	}
	for r.sc.Scan() {
		payload, ok := data(r.sc.Bytes())
		if !ok {
			continue
		}
		if isDone(payload) {
			r.done = true
			return nil, io.EOF
		}
		return payload, nil
	}
	if err := r.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w: over %d bytes", ErrTooLong, r.max)
		}
		return nil, err
	}
	return nil, ErrNoDone
}

// Split is the push form of Reader, for a stream that arrives through Write calls: buf holds
// the bytes not consumed yet. It calls fn with the payload of each complete line's data in
// order, until fn returns false, and returns what is left of buf (the start of a line not
// ended yet, or what follows the line fn stopped at). It returns io.EOF at [DONE] (and
// nothing left), or ErrTooLong, with nothing left, for a line (ended or not) of maxLine
// bytes or more, "\n" excluded: the lines Reader refuses. A last line the stream never ends
// is left; Reader would read it at the end of its stream. The payload given to fn, and what
// is left, alias buf.
func Split(buf []byte, maxLine int, fn func(payload []byte) bool) ([]byte, error) {
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			break
		}
		line := buf[:i]
		buf = buf[i+1:]
		if i >= maxLine {
			return nil, fmt.Errorf("%w: over %d bytes", ErrTooLong, maxLine)
		}
		payload, ok := data(bytes.TrimSuffix(line, []byte{'\r'})) // as bufio.ScanLines
		if !ok {
			continue
		}
		if isDone(payload) {
			return nil, io.EOF
		}
		if !fn(payload) {
			return buf, nil
		}
	}
	if len(buf) >= maxLine {
		return nil, fmt.Errorf("%w: over %d bytes", ErrTooLong, maxLine)
	}
	return buf, nil
}
