package receipts

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/internal/atomicfile"
	"github.com/meshinfer/meshinfer/internal/jsonlog"
)

// ErrClosed is returned by Append after Close.
var ErrClosed = errors.New("receipts log closed")

// tailWindow is how much of the file's end Open reads to continue the numbering, in bytes:
// two maximal lines, hundreds of ordinary ones. Only a log whose tail holds no valid receipt
// of this node (all torn or altered) is read whole.
const tailWindow = 2 * MaxLineSize

// Log appends signed receipts to one file (an internal/jsonlog log). Its methods are safe for
// concurrent use.
type Log struct {
	key    crypto.PrivKey
	server string // peer ID of key

	log *jsonlog.Log
	seq uint64 // of the last line written whole; guarded by log's lock (see Append)
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
	jl, err := jsonlog.Open(filepath.Join(dir, File), MaxLineSize, atomicfile.OpenPrivate)
	if err != nil {
		return nil, fmt.Errorf("open receipts: %w", err)
	}
	l := &Log{key: key, server: id.String(), log: jl}
	if err := l.resume(); err != nil {
		jl.Close()
		return nil, fmt.Errorf("open receipts: %w", err)
	}
	return l, nil
}

// resume sets seq from the end of the file.
func (l *Log) resume() error {
	all := l.log.Opened()
	size := all.Size()
	if size == 0 {
		return nil
	}
	// The highest seq, not the last line's: a copied line at the end must not rewind the
	// numbering into seqs already used.
	var v verifier
	ours := func(r Receipt, err error) bool {
		if err == nil && r.Server == l.server {
			l.seq = max(l.seq, r.Seq)
		}
		return true
	}
	start := max(0, size-tailWindow)
	err := jsonlog.Scan(io.NewSectionReader(all, start, size-start), MaxLineSize, func(n int, line []byte, err error) bool {
		if err == nil && (n > 1 || start == 0) { // the window may begin inside its first line
			ours(v.parse(line))
		}
		return true
	})
	if err != nil || l.seq > 0 || start == 0 {
		return err
	}
	return read(all, ours)
}

// Append signs r as the next receipt of this node and appends it: it fills Server, Seq and
// Sig, and Time with the current time when zero (Time is stored in UTC). It returns once the
// line is written and synced to disk, so a receipt Append returned nil for survives a crash.
func (l *Log) Append(r Receipt) error {
	return l.AppendAll([]Receipt{r})
}

// AppendAll appends rs in order as Append would each, with one sync for them all. An
// invalid receipt is left out and named in the error, the others appended; a write that
// fails stops there, the receipts before it standing.
func (l *Log) AppendAll(rs []Receipt) error {
	var invalid []error
	valid := rs[:0:0]
	for _, r := range rs {
		if r.Time.IsZero() {
			r.Time = time.Now()
		}
		r.Time = r.Time.UTC()
		r.Server, r.Sig = l.server, ""
		if err := validate(&r); err != nil {
			invalid = append(invalid, fmt.Errorf("append receipt: %w", err))
			continue
		}
		valid = append(valid, r)
	}
	rs = valid
	if len(rs) == 0 {
		return errors.Join(invalid...)
	}
	// Numbering and signing run under the log's lock, so seq order is file order. A line
	// that fails to write (maybe partly) does not use its seq: a partial line is not a
	// receipt, so the numbering has no gap.
	err := l.log.AppendAll(len(rs), func(i int) ([]byte, error) {
		rs[i].Seq = l.seq + 1
		return encodeLine(l.key, rs[i])
	}, func(i int) { l.seq = rs[i].Seq })
	if errors.Is(err, jsonlog.ErrClosed) {
		return errors.Join(append(invalid, ErrClosed)...)
	}
	if err != nil {
		return errors.Join(append(invalid, fmt.Errorf("append receipt: %w", err))...)
	}
	return errors.Join(invalid...)
}

// Close waits for Appends being synced and closes the file. Idempotent; Append fails with
// ErrClosed afterwards.
func (l *Log) Close() error {
	if err := l.log.Close(); err != nil {
		return fmt.Errorf("close receipts: %w", err)
	}
	return nil
}
