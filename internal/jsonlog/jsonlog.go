// Package jsonlog keeps an append-only log of lines (JSON documents, one a line) in one file:
// mesh/receipts' signed receipts and transport/gateway's usage events are such logs.
//
// Invariants:
//   - The file is created with mode 0600 (its directory 0700) and opened O_APPEND: every
//     line lands at the end, whatever else has the file open.
//   - Lines are written whole and in the order Append was called, never interleaved, and
//     each is at most the log's maximum in bytes, newline included.
//   - Append returns once its line is synced to disk, so a line it returned nil for
//     survives a crash. The sync runs outside the lock: one sync may cover several lines.
//   - A crash or a failed write can leave a torn last line; the next line then starts on a
//     fresh line, so a torn line never swallows a good one. Scan reads such a file back.
//
// What a line means (numbering, signatures, sums) is its user's; this package only frames
// and stores lines. Like every package under internal/, it imports nothing of the project,
// only the standard library (testnet/deps_test.go enforces it).
package jsonlog

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// ErrClosed is returned by Append after Close.
var ErrClosed = errors.New("log closed")

// ErrTooLong is a line over the log's maximum: refused by Append, reported by Scan.
var ErrTooLong = errors.New("line too long")

// Log appends lines to one file. Its methods are safe for concurrent use.
type Log struct {
	max    int
	opened *io.SectionReader // the file's content at Open

	// syncing counts Appends between their write and their sync, so that Close waits for
	// them before closing the file.
	syncing sync.WaitGroup

	// mu serializes writes, so that lines never interleave and file order is Append order.
	mu     sync.Mutex
	f      *os.File
	closed bool
	torn   bool // the file may end inside a line: the next line starts with a newline
}

// Flags and Perm are how a log file is opened: for appending, created with mode 0600.
const (
	Flags = os.O_RDWR | os.O_CREATE | os.O_APPEND
	Perm  = 0o600
)

// Open opens the log at path for appending, creating its directory (mode 0700) and the file
// (mode 0600) if needed. Lines are at most max bytes, newline included. The path must be a
// regular file. With openFile (nil: os.OpenFile), the caller opens the file (with Flags and
// Perm): a data file's user refuses symbolic links and other users' files that way.
func Open(path string, max int, openFile func(string, int, os.FileMode) (*os.File, error)) (*Log, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if openFile == nil {
		openFile = os.OpenFile
	}
	f, err := openFile(path, Flags, Perm)
	if err != nil {
		return nil, err
	}
	l, err := open(f, max)
	if err != nil {
		f.Close()
		return nil, err
	}
	return l, nil
}

func open(f *os.File, max int) (*Log, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", f.Name())
	}
	l := &Log{max: max, f: f, opened: io.NewSectionReader(f, 0, st.Size())}
	if size := st.Size(); size > 0 {
		var last [1]byte
		if _, err := f.ReadAt(last[:], size-1); err != nil {
			return nil, err
		}
		l.torn = last[0] != '\n'
	}
	return l, nil
}

// Opened returns the file's content as it was at Open, for replay (with Scan, or a window of
// it with io.NewSectionReader). Valid until Close.
func (l *Log) Opened() *io.SectionReader { return l.opened }

// Append appends one line: it calls line under the log's lock for the line to write (ending
// in its one newline), writes it, and once written, still under the lock, calls written (if
// not nil). So what line and written touch is guarded by the lock, and what line numbers
// (a sequence) follows file order. It returns once the line is synced to disk. An error of
// line is returned as is; written is not called for a line that failed.
func (l *Log) Append(line func() ([]byte, error), written func()) error {
	return l.AppendAll(1, func(int) ([]byte, error) { return line() }, func(int) {
		if written != nil {
			written()
		}
	})
}

// AppendAll appends n lines as Append would each, in order, with one sync for them all: a
// writer with several lines waiting pays for one sync instead of one a line. line(i) and
// written(i) are called under the lock as in Append. It stops at the first line that fails
// and returns its error; the lines before it stand (and are synced).
func (l *Log) AppendAll(n int, line func(i int) ([]byte, error), written func(i int)) error {
	f, werr := l.write(n, line, written)
	if f == nil {
		return werr
	}
	// The sync runs outside mu: other Appends may write meanwhile, and one sync covers them
	// all. Close waits for it.
	defer l.syncing.Done()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	return werr
}

// write writes up to n lines under mu, stopping at the first that fails (werr). f is nil
// when no line was written; otherwise it has added one to l.syncing. The lock is held
// across the writes, which go to the page cache, not across the sync.
func (l *Log) write(n int, line func(i int) ([]byte, error), written func(i int)) (f *os.File, werr error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	wrote := false
	for i := range n {
		if werr = l.writeOne(i, line, written); werr != nil {
			break
		}
		wrote = true
	}
	if !wrote {
		return nil, werr
	}
	l.syncing.Add(1)
	return l.f, werr
}

// writeOne writes line i under mu.
func (l *Log) writeOne(i int, line func(i int) ([]byte, error), written func(i int)) error {
	b, err := line(i)
	if err != nil {
		return err
	}
	if len(b) > l.max {
		return fmt.Errorf("%w: %d bytes encoded, max %d", ErrTooLong, len(b), l.max)
	}
	if l.torn {
		b = append([]byte{'\n'}, b...)
	}
	n, err := l.f.Write(b)
	if err != nil {
		// Part of the line may be in the file: start the next one on a fresh line.
		l.torn = l.torn || n > 0
		return err
	}
	l.torn = false
	written(i)
	return nil
}

// Close waits for Appends being synced and closes the file. Idempotent; Append fails with
// ErrClosed afterwards.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	l.syncing.Wait()
	return l.f.Close()
}

// Scan reads a log from r line by line, calling fn with each line's number (from 1) and the
// line without its newline, until the end of r or until fn returns false. Empty lines are
// skipped (they keep their number). A line of max bytes or more, newline excluded (one
// Append would refuse), is passed as ErrTooLong with a nil line, without being held in
// memory. line is valid only during the call. The error is about reading r.
func Scan(r io.Reader, max int, fn func(n int, line []byte, err error) bool) error {
	br := bufio.NewReaderSize(r, max)
	for n := 1; ; n++ {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// Too long: skip to the end of the line, one buffer at a time.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			if !fn(n, nil, ErrTooLong) || errors.Is(err, io.EOF) {
				return nil
			}
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		eof := errors.Is(err, io.EOF)
		line = bytes.TrimSuffix(line, []byte{'\n'})
		if len(line) > 0 && !fn(n, line, nil) {
			return nil
		}
		if eof {
			return nil
		}
	}
}
