package receipts

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// ErrClosed is returned by Append after Close.
var ErrClosed = errors.New("receipts log closed")

// tailWindow is how much of the file's end Open reads to continue the numbering, in bytes:
// two maximal lines, hundreds of ordinary ones. Only a log whose tail holds no valid receipt
// of this node (all torn or altered) is read whole.
const tailWindow = 2 * MaxLineSize

// Log appends signed receipts to one file. Its methods are safe for concurrent use.
type Log struct {
	key    crypto.PrivKey
	server string // peer ID of key

	// appending counts Appends between their write and their sync, so that Close waits for
	// them before closing the file.
	appending sync.WaitGroup

	// mu serializes writes, so that the order of lines in the file is the order of seq.
	mu     sync.Mutex
	f      *os.File
	closed bool
	seq    uint64 // of the last line written whole
	torn   bool   // the file may end inside a line: the next line starts with a newline
}

// Open opens dir/File for appending, creating it with mode 0600 if absent, and continues the
// numbering after the highest seq of a valid receipt of key's node near the end of the file.
// key must be the node's ed25519 identity key.
func Open(dir string, key crypto.PrivKey) (*Log, error) {
	if key.Type() != crypto.Ed25519 {
		return nil, fmt.Errorf("open receipts: key type %v is not ed25519", key.Type())
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("open receipts: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open receipts: %w", err)
	}
	// O_APPEND: every write lands at the end, whatever else has the file open.
	f, err := os.OpenFile(filepath.Join(dir, File), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open receipts: %w", err)
	}
	l := &Log{key: key, server: id.String(), f: f}
	if err := l.resume(); err != nil {
		f.Close()
		return nil, err
	}
	return l, nil
}

// resume sets seq and torn from the end of the file.
func (l *Log) resume() error {
	st, err := l.f.Stat()
	if err != nil {
		return fmt.Errorf("open receipts: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("open receipts: %s is not a regular file", l.f.Name())
	}
	size := st.Size()
	if size == 0 {
		return nil
	}
	start := max(0, size-tailWindow)
	tail := make([]byte, size-start)
	if _, err := l.f.ReadAt(tail, start); err != nil {
		return fmt.Errorf("open receipts: %w", err)
	}
	l.torn = tail[len(tail)-1] != '\n'
	// The highest seq, not the last line's: a copied line at the end must not rewind the
	// numbering into seqs already used.
	ours := func(r Receipt, err error) bool {
		if err == nil && r.Server == l.server {
			l.seq = max(l.seq, r.Seq)
		}
		return true
	}
	var v verifier
	for i, line := range bytes.Split(tail, []byte{'\n'}) {
		if i == 0 && start > 0 {
			continue // the window may begin inside this line
		}
		if len(line) > 0 {
			ours(v.parse(line))
		}
	}
	if l.seq > 0 || start == 0 {
		return nil
	}
	if err := read(io.NewSectionReader(l.f, 0, size), ours); err != nil {
		return fmt.Errorf("open receipts: %w", err)
	}
	return nil
}

// Append signs r as the next receipt of this node and appends it: it fills Server, Seq and
// Sig, and Time with the current time when zero (Time is stored in UTC). It returns once the
// line is written and synced to disk, so a receipt Append returned nil for survives a crash.
func (l *Log) Append(r Receipt) error {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	r.Time = r.Time.UTC()
	r.Server, r.Sig = l.server, ""
	if err := validate(&r); err != nil {
		return fmt.Errorf("append receipt: %w", err)
	}
	f, err := l.write(r)
	if err != nil {
		return err
	}
	// The sync runs outside mu: other Appends may write meanwhile, and one sync covers them
	// all. Close waits for it.
	defer l.appending.Done()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("append receipt: sync: %w", err)
	}
	return nil
}

// write numbers, signs and writes r under mu. On success it has added one to l.appending.
// The lock is held across the write, which goes to the page cache, not across the sync:
// seq order must be file order.
func (l *Log) write(r Receipt) (*os.File, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	r.Seq = l.seq + 1
	line, err := encodeLine(l.key, r)
	if err != nil {
		return nil, fmt.Errorf("append receipt: %w", err)
	}
	if len(line) > MaxLineSize {
		return nil, fmt.Errorf("append receipt: %d bytes encoded, max %d", len(line), MaxLineSize)
	}
	if l.torn {
		line = append([]byte{'\n'}, line...)
	}
	n, err := l.f.Write(line)
	if err != nil {
		// Part of the line may be in the file: start the next one on a fresh line. Its seq
		// is not used: a partial line is not a receipt, so the numbering has no gap.
		l.torn = l.torn || n > 0
		return nil, fmt.Errorf("append receipt: %w", err)
	}
	l.seq, l.torn = r.Seq, false
	l.appending.Add(1)
	return l.f, nil
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
	l.appending.Wait()
	if err := l.f.Close(); err != nil {
		return fmt.Errorf("close receipts: %w", err)
	}
	return nil
}
