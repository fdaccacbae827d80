package gateway

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshinfer/meshinfer/internal/atomicfile"
	"github.com/meshinfer/meshinfer/internal/jsonlog"
)

// IdempotencyFile is the name, inside the data dir, of the log of completed results that
// the WebSocket endpoint keeps across a restart of the coordinator (WithRecords), mode 0600.
// See the package documentation ("Across a restart").
const IdempotencyFile = "idempotency.jsonl"

// Bounds of the idempotency records. A record outlives its in-memory twin in the result
// cache by nothing: same age (cacheTTL) and count (cacheEntries); the file's byte bound is
// its own (maxRecordsBytes, compacted to half of it).
const (
	// maxRecordLine bounds one record in bytes, newline included: the largest completion
	// (4,096 tokens, transport/openai's max_tokens bound) of tokens of a few bytes each,
	// JSON-escaped, with room. A result whose record would be larger is recorded without
	// its tokens: a resubmission after a restart then gets coordinator_lost.
	maxRecordLine = 128 << 10
	// maxRecordsBytes bounds the file: past it, the next append first rewrites it with the
	// live records only (younger than cacheTTL, the newest cacheEntries of them, and at
	// most half this size), so the file stays under maxRecordsBytes plus one line.
	maxRecordsBytes = 32 << 20
)

// record is one line of IdempotencyFile: a completed run of a request with an idempotency
// key, as its resubmission after a restart is answered.
type idemRecord struct {
	Time   time.Time `json:"time"`   // when the run completed, UTC
	Run    string    `json:"run"`    // runKey: hex SHA-256 of the session and idempotency key
	Digest string    `json:"digest"` // hex SHA-256 of the request as run (apiRequest)
	// Tokens are the run's token texts, by index; absent (and Dropped set) when the
	// result was too large to keep.
	Tokens    []string        `json:"tokens,omitempty"`
	Dropped   bool            `json:"dropped,omitempty"`
	Finish    string          `json:"finish"`
	Usage     json.RawMessage `json:"usage,omitempty"`
	Meshinfer json.RawMessage `json:"meshinfer,omitempty"`
}

func (rc *idemRecord) valid() bool {
	return !rc.Time.IsZero() && isHex(rc.Run, 64) && isHex(rc.Digest, 64) && !(rc.Dropped && len(rc.Tokens) > 0)
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// records is the idempotency log of a WebSocket endpoint: an internal/jsonlog log in the
// data dir, appended to before a completed result reaches its client, read back at start.
type records struct {
	path string
	max  int64 // maxRecordsBytes; tests lower it

	// bytes is the size of the file (as written: what jsonlog adds for a torn line aside).
	bytes atomic.Int64

	// mu guards log: appends share it (jsonlog orders their lines, and one sync may cover
	// several), the compaction that replaces the file holds it alone. It is the file's
	// lock, held across its writes as jsonlog's is.
	mu  sync.RWMutex
	log *jsonlog.Log
}

// openRecords reads the records at dir/IdempotencyFile that are still live at now, drops
// the rest (expired, beyond the bounds, or unreadable: a torn last line from a crash
// mid-write, or an altered one), rewrites the file with the live ones and opens it for
// appending. It never fails on the content of the file, only on I/O.
func openRecords(dir string, now time.Time) (*records, []idemRecord, error) {
	if dir == "" {
		return nil, nil, errors.New("idempotency records: no data dir")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("idempotency records: %w", err)
	}
	s := &records{path: filepath.Join(dir, IdempotencyFile), max: maxRecordsBytes}
	live, err := s.compact(now)
	if err != nil {
		return nil, nil, fmt.Errorf("idempotency records: %w", err)
	}
	return s, live, nil
}

// compact reads the file, keeps the live records, replaces the file with them and
// (re)opens the log. Called with mu held, or before s is shared. On an error the log in use
// stays in use: a failed compaction costs the file's bound, never the records to come.
func (s *records) compact(now time.Time) ([]idemRecord, error) {
	live, err := readRecords(s.path, now, s.max/2)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	for _, rc := range live {
		b, _ := json.Marshal(&rc) // cannot fail: it was decoded from JSON
		buf.Write(b)
		buf.WriteByte('\n')
	}
	if _, err := atomicfile.WriteFile(s.path, buf.Bytes()); err != nil {
		return nil, err
	}
	log, err := jsonlog.Open(s.path, maxRecordLine, atomicfile.OpenPrivate)
	if err != nil {
		return nil, err
	}
	if s.log != nil {
		s.log.Close() // its lines are in the new file, those still live
	}
	s.log = log
	s.bytes.Store(int64(buf.Len()))
	return live, nil
}

// readRecords returns the live records of the file at path (none if it does not exist),
// oldest first: valid, completed within cacheTTL before now, the newest cacheEntries of
// them within maxBytes, the last record of a run winning.
func readRecords(path string, now time.Time, maxBytes int64) ([]idemRecord, error) {
	f, err := atomicfile.OpenPrivate(path, os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type kept struct {
		rc   idemRecord
		size int
	}
	var all []kept
	err = jsonlog.Scan(f, maxRecordLine, func(_ int, line []byte, err error) bool {
		var rc idemRecord
		if err == nil && json.Unmarshal(line, &rc) == nil && rc.valid() &&
			!rc.Time.After(now) && now.Sub(rc.Time) <= cacheTTL {
			all = append(all, kept{rc, len(line) + 1})
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	// Newest first, so the bounds keep the newest and a run's last record wins.
	seen := make(map[string]bool)
	var out []idemRecord
	var size int64
	for i := len(all) - 1; i >= 0 && len(out) < cacheEntries; i-- {
		k := all[i]
		if seen[k.rc.Run] || size+int64(k.size) > maxBytes {
			continue
		}
		seen[k.rc.Run] = true
		size += int64(k.size)
		out = append(out, k.rc)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

// put appends rc, synced, compacting the file first when it is full. A result too large
// for a line is recorded without its tokens.
func (s *records) put(rc idemRecord, now time.Time) error {
	rc.Time = rc.Time.UTC()
	line, err := json.Marshal(&rc)
	if err == nil && len(line)+1 > maxRecordLine {
		rc.Tokens, rc.Dropped = nil, true
		line, err = json.Marshal(&rc)
	}
	if err != nil {
		return fmt.Errorf("idempotency record: %w", err)
	}
	line = append(line, '\n')
	if s.bytes.Load()+int64(len(line)) > s.max {
		s.mu.Lock()
		var err error
		if s.log != nil && s.bytes.Load()+int64(len(line)) > s.max {
			_, err = s.compact(now)
		}
		s.mu.Unlock()
		if err != nil {
			return fmt.Errorf("idempotency records: compact: %w", err)
		}
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.log == nil {
		return jsonlog.ErrClosed
	}
	err = s.log.Append(func() ([]byte, error) { return line, nil }, func() { s.bytes.Add(int64(len(line))) })
	if err != nil {
		return fmt.Errorf("idempotency record: %w", err)
	}
	return nil
}

// close closes the file. Idempotent.
func (s *records) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return nil
	}
	err := s.log.Close()
	s.log = nil
	return err
}
