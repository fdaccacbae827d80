package gateway

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/atomicfile"
	"github.com/meshinfer/meshinfer/internal/jsonlog"
)

// UsageFile is the name of the meter's log inside the data dir, mode 0600. See the package
// documentation for its format.
const UsageFile = "usage.jsonl"

// MaxUsageLine bounds one line of UsageFile in bytes, newline included. An event is about
// 250 bytes; a model name of maxModel bytes escaped in full is under 2 KiB, and a task
// receipt with it under 6 KiB. A pipeline's event adds up to maxStageReceipts stage
// receipts, each at most maxReceipt bytes, at most doubled by escaping, with a
// countersignature and member names. A longer line is not one of ours and is skipped
// unread.
const MaxUsageLine = 8<<10 + maxStageReceipts*(2*maxReceipt+256)

// Bounds of an event's strings, in bytes: a model name as transport/openai bounds it, a
// libp2p peer ID with room to spare, an outcome code.
const (
	maxModel   = 256
	maxPeer    = 128
	maxOutcome = 64
)

// Outcomes of a metered task with a meaning for the meter. Any other outcome is the task's
// error code (inference.Code, or client_disconnected) and counts as failed.
const (
	// OutcomeCompleted: the task ended with its result.
	OutcomeCompleted = "completed"
	// OutcomeVerificationFailed: the result did not match the verifying execution. The
	// event is metered as zero tokens: the client pays nothing for a wrong answer.
	OutcomeVerificationFailed = string(inference.CodeVerificationFailed)
)

// ErrMeterClosed is returned by Record after Close.
var ErrMeterClosed = errors.New("meter closed")

// MeterEvent is one task served through the coordinator, as UsageFile records it.
type MeterEvent struct {
	Time       time.Time `json:"time"`             // when the task ended; stored in UTC
	KeyID      string    `json:"key_id"`           // the API key's ID (Session.KeyID)
	Device     string    `json:"device,omitempty"` // the client's DeviceHeader (Session.DeviceID); absent: none sent
	Model      string    `json:"model"`            // the model that ran; "" if none was chosen
	Peer       string    `json:"peer"`             // peer ID of the serving peer; "" if none served
	TokensIn   int       `json:"tokens_in"`        // prompt tokens
	TokensOut  int       `json:"tokens_out"`       // completion tokens
	DurationMS int64     `json:"duration_ms"`      // from admission to the end of the task
	Verified   bool      `json:"verified"`         // a second execution agreed (Verification passed)
	Outcome    string    `json:"outcome"`          // OutcomeCompleted or the error code
	// Verification is the verdict of a sampled verification: passed, failed (Outcome is then
	// OutcomeVerificationFailed), inconclusive or skipped; absent when the task was not
	// sampled.
	Verification inference.Verdict `json:"verification,omitempty"`
	// Receipt is the serving peer's signed task receipt (mesh/receipts), kept when it held
	// for what the client received; Countersig is the coordinator's countersignature of it
	// and Coordinator the coordinator's peer ID. All three are absent for a task served
	// without a receipt (by the coordinator itself, the cloud, or a failed task).
	Receipt     string `json:"receipt,omitempty"`
	Countersig  string `json:"countersig,omitempty"`
	Coordinator string `json:"coordinator,omitempty"`
	// StageReceipts are, for a task a pipeline served, its stages' signed receipts of their
	// parts (mesh/receipts' stage receipts) that held, each with the coordinator's
	// countersignature (Coordinator is then its peer ID), in chain order; absent for any
	// other task and for a pipeline whose stages gave none.
	StageReceipts []inference.StageReceipt `json:"stage_receipts,omitempty"`
	// Idempotency names the gateway run of a task sent with an idempotency key: the hex
	// SHA-256 of its session and key (IdempotencyFrom), never the key itself; absent
	// otherwise. A completed task with one is never run again for a resubmission of its key
	// within the result cache's age, even by a coordinator restarted since (Meter.Billed).
	Idempotency string `json:"idempotency,omitempty"`
}

// Bounds of an event's receipt fields, in bytes: a task or stage receipt is under 2 KiB
// (receipts.MaxTaskReceipt), a countersignature is 96 bytes; and the stage receipts of one
// event: a pipeline has at most 64 stages (transport/stage's MaxStages).
const (
	maxReceipt       = 2 << 10
	maxCountersig    = 128
	maxStageReceipts = 64
)

// validate checks the values an event must have.
func (e *MeterEvent) validate() error {
	switch {
	case e.Time.IsZero():
		return errors.New("time is missing")
	case !validKeyID(e.KeyID):
		return fmt.Errorf("key_id %q is not a key id", e.KeyID)
	case !validDevice(e.Device):
		return fmt.Errorf("device is not at most %d visible ASCII characters", MaxDeviceID)
	case len(e.Model) > maxModel:
		return fmt.Errorf("model is %d bytes, at most %d", len(e.Model), maxModel)
	case len(e.Peer) > maxPeer:
		return fmt.Errorf("peer is %d bytes, at most %d", len(e.Peer), maxPeer)
	case !validOutcome(e.Outcome):
		return fmt.Errorf("outcome %q is not 1 to %d of a-z, 0-9 and _", e.Outcome, maxOutcome)
	case e.TokensIn < 0 || e.TokensOut < 0 || e.DurationMS < 0:
		return errors.New("negative count")
	case !e.Verification.Valid():
		return fmt.Errorf("verification %q is not passed, failed, inconclusive or skipped", e.Verification)
	case len(e.Receipt) > maxReceipt || len(e.Countersig) > maxCountersig || len(e.Coordinator) > maxPeer:
		return errors.New("receipt, countersig or coordinator too long")
	case e.Idempotency != "" && !isHex(e.Idempotency, 2*sha256.Size):
		return errors.New("idempotency is not a hex SHA-256")
	case len(e.StageReceipts) > maxStageReceipts:
		return fmt.Errorf("%d stage receipts, at most %d", len(e.StageReceipts), maxStageReceipts)
	}
	for _, sr := range e.StageReceipts {
		if len(sr.Receipt) > maxReceipt || len(sr.Countersig) > maxCountersig {
			return errors.New("stage receipt or countersig too long")
		}
	}
	return nil
}

func validOutcome(s string) bool {
	if s == "" || len(s) > maxOutcome {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Usage sums the events of one key. Failed counts every outcome but OutcomeCompleted; tokens
// of OutcomeVerificationFailed events count as zero.
type Usage struct {
	Requests  int           `json:"requests"`
	Completed int           `json:"completed"`
	Failed    int           `json:"failed"`
	TokensIn  int64         `json:"tokens_in"`
	TokensOut int64         `json:"tokens_out"`
	Duration  time.Duration `json:"duration_ns"`
}

// Add counts e, by the metering rule: a task that failed verification counts no tokens
// (whatever the event says).
func (u *Usage) Add(e MeterEvent) {
	u.Requests++
	if e.Outcome == OutcomeCompleted {
		u.Completed++
	} else {
		u.Failed++
	}
	if e.Outcome != OutcomeVerificationFailed {
		u.TokensIn += int64(e.TokensIn)
		u.TokensOut += int64(e.TokensOut)
	}
	u.Duration += time.Duration(e.DurationMS) * time.Millisecond
}

// Meter appends one MeterEvent per task to UsageFile (an internal/jsonlog log) and keeps the
// Usage of each key and of each device of a key: what the file held at OpenMeter plus every
// event recorded since. Its methods are safe for concurrent use.
type Meter struct {
	log *jsonlog.Log

	// mu guards the totals.
	mu     sync.Mutex
	totals map[string]Usage
	// devices holds the totals of events with a device. It has at most one entry per
	// line of the file, as many as the devices the keys' holders named.
	devices map[keyDevice]Usage
	// billed holds when each gateway run (MeterEvent.Idempotency) was metered as ended
	// with its result (completed, or verification_failed: the client had it), the newest
	// maxBilled of them; billedOrder is their runs, oldest first.
	billed      map[string]time.Time
	billedOrder []string
}

// maxBilled bounds the runs Billed remembers: 16 times the gateway's result cache, more
// tasks than a coordinator completes in the cache's 10 minutes; 100 bytes each.
const maxBilled = 16 * cacheEntries

// keyDevice names one device of one key.
type keyDevice struct{ keyID, device string }

// OpenMeter opens dir/UsageFile for appending, creating dir (mode 0700) and the file (mode
// 0600) if needed, and sums the events already in it. Lines that cannot be read (torn by a
// crash mid-write, or altered) are left out of the sums; ReadUsage reports them.
func OpenMeter(dir string) (*Meter, error) {
	if dir == "" {
		return nil, errors.New("open meter: no data dir")
	}
	jl, err := jsonlog.Open(filepath.Join(dir, UsageFile), MaxUsageLine, atomicfile.OpenPrivate)
	if err != nil {
		return nil, fmt.Errorf("open meter: %w", err)
	}
	m := &Meter{log: jl, totals: make(map[string]Usage), devices: make(map[keyDevice]Usage), billed: make(map[string]time.Time)}
	if _, err := readEvents(jl.Opened(), m.add); err != nil {
		jl.Close()
		return nil, fmt.Errorf("open meter: %w", err)
	}
	return m, nil
}

// add counts e in the totals.
func (m *Meter) add(e MeterEvent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.totals[e.KeyID]
	u.Add(e)
	m.totals[e.KeyID] = u
	if e.Device != "" {
		kd := keyDevice{e.KeyID, e.Device}
		d := m.devices[kd]
		d.Add(e)
		m.devices[kd] = d
	}
	if e.Idempotency != "" && (e.Outcome == OutcomeCompleted || e.Outcome == OutcomeVerificationFailed) {
		if _, ok := m.billed[e.Idempotency]; !ok {
			m.billedOrder = append(m.billedOrder, e.Idempotency)
		}
		m.billed[e.Idempotency] = e.Time
		for len(m.billedOrder) > maxBilled {
			delete(m.billed, m.billedOrder[0])
			m.billedOrder = m.billedOrder[1:]
		}
	}
}

// Billed reports whether the task of the gateway run named run (MeterEvent.Idempotency)
// was metered as ended with its result within the result cache's age (10 minutes) before
// now: the gateway then never runs it again, even after a restart.
func (m *Meter) Billed(run string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.billed[run]
	return ok && now.Sub(t) <= cacheTTL
}

// Record appends e to the log and counts it. e.Time must be set (it is stored in UTC) and
// e.KeyID must be a key ID (Session.KeyID). When e.Outcome is OutcomeVerificationFailed,
// Record zeroes e's tokens before writing: the caller passes the outcome, the meter applies
// the rule. Record returns once the line is written and synced to disk.
func (m *Meter) Record(e MeterEvent) error {
	e.Time = e.Time.UTC()
	if e.Outcome == OutcomeVerificationFailed {
		e.TokensIn, e.TokensOut = 0, 0
	}
	if err := e.validate(); err != nil {
		return fmt.Errorf("record usage: %w", err)
	}
	line, err := json.Marshal(&e)
	if err != nil {
		return fmt.Errorf("record usage: %w", err)
	}
	line = append(line, '\n')
	// The event counts once its line is written (a partial line is not an event), before
	// the sync.
	err = m.log.Append(func() ([]byte, error) { return line, nil }, func() { m.add(e) })
	if errors.Is(err, jsonlog.ErrClosed) {
		return ErrMeterClosed
	}
	if err != nil {
		return fmt.Errorf("record usage: %w", err)
	}
	return nil
}

// Usage returns the usage of the key with ID keyID: the file's at OpenMeter plus every
// event recorded since.
func (m *Meter) Usage(keyID string) Usage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.totals[keyID]
}

// DeviceUsage returns the part of the key keyID's usage that came from the device named
// device (events whose Device is device), counted as Usage counts.
func (m *Meter) DeviceUsage(keyID, device string) Usage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.devices[keyDevice{keyID, device}]
}

// sessionUsage returns the usage of s's key and of s's device, read together, so the device's
// part never holds an event the key's does not.
func (m *Meter) sessionUsage(s Session) (key, device Usage) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.totals[s.KeyID], m.devices[keyDevice{s.KeyID, s.DeviceID}]
}

// Close waits for Records being synced and closes the file. Idempotent; Record fails with
// ErrMeterClosed afterwards, Usage keeps answering.
func (m *Meter) Close() error {
	if err := m.log.Close(); err != nil {
		return fmt.Errorf("close meter: %w", err)
	}
	return nil
}

// maxReportedLines bounds how many bad line numbers a *BadLinesError lists; Count covers
// them all.
const maxReportedLines = 10

// BadLinesError is ReadUsage's report of lines it left out: torn by a crash mid-write, too
// long, or not a valid event.
type BadLinesError struct {
	Path  string
	Count int   // lines left out
	Lines []int // the first maxReportedLines of them, numbered from 1
}

func (e *BadLinesError) Error() string {
	return fmt.Sprintf("%s: %d lines left out (torn by a crash mid-write, or altered), first at lines %v", e.Path, e.Count, e.Lines)
}

// ReadUsage sums the log at path by key ID. Lines that cannot be read are skipped and
// reported: the totals come with a *BadLinesError then, and are still valid. Any other error
// is about the file itself (a missing file gives one that matches fs.ErrNotExist), with nil
// totals.
func ReadUsage(path string) (map[string]Usage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read usage: %w", err)
	}
	defer f.Close()
	totals := make(map[string]Usage)
	bad, err := readEvents(f, func(e MeterEvent) {
		u := totals[e.KeyID]
		u.Add(e)
		totals[e.KeyID] = u
	})
	if err != nil {
		return nil, fmt.Errorf("read usage %s: %w", path, err)
	}
	if bad != nil {
		bad.Path = path
		return totals, bad
	}
	return totals, nil
}

// ReadEvents streams the log at path, calling fn with each valid event in order. Lines that
// cannot be read are skipped and reported in a *BadLinesError, returned after every valid
// event was delivered; any other error is about the file itself.
func ReadEvents(path string, fn func(MeterEvent)) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("read usage: %w", err)
	}
	defer f.Close()
	bad, err := readEvents(f, fn)
	if err != nil {
		return fmt.Errorf("read usage %s: %w", path, err)
	}
	if bad != nil {
		bad.Path = path
		return bad
	}
	return nil
}

// readEvents streams a log, calling fn with each valid event. It returns the lines it left
// out (nil if none) and the error of reading, if any. A line longer than MaxUsageLine
// (newline included) is skipped without being held in memory.
func readEvents(rd io.Reader, fn func(MeterEvent)) (*BadLinesError, error) {
	var bad *BadLinesError
	skip := func(n int) {
		if bad == nil {
			bad = &BadLinesError{}
		}
		bad.Count++
		if len(bad.Lines) < maxReportedLines {
			bad.Lines = append(bad.Lines, n)
		}
	}
	err := jsonlog.Scan(rd, MaxUsageLine, func(n int, line []byte, err error) bool {
		if err != nil { // too long: skipped unread
			skip(n)
		} else if e, perr := parseEvent(line); perr != nil {
			skip(n)
		} else {
			fn(e)
		}
		return true
	})
	return bad, err
}

// parseEvent decodes one line (without its newline). Fields it does not know are ignored, so
// a newer coordinator's log still sums.
func parseEvent(line []byte) (MeterEvent, error) {
	var e MeterEvent
	if err := json.Unmarshal(line, &e); err != nil {
		return MeterEvent{}, err
	}
	if err := e.validate(); err != nil {
		return MeterEvent{}, err
	}
	return e, nil
}

// usageResponse is the JSON of GET /v1/usage.
type usageResponse struct {
	Object string   `json:"object"` // "meshinfer.usage"
	Key    keyBrief `json:"key"`
	Usage  Usage    `json:"usage"`
	// Device is the calling device's part of Usage; absent when the request named no
	// device.
	Device *deviceUsage `json:"device,omitempty"`
}

type deviceUsage struct {
	ID    string `json:"id"`
	Usage Usage  `json:"usage"`
}

type keyBrief struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// UsageHandler serves GET /v1/usage: the calling key's Usage from m and, when the request
// names a device (DeviceHeader), that device's part of it. It must be wrapped in
// RequireKey, which provides the Session; without one it answers 503 (a wiring mistake,
// never a usage of no key). Methods other than GET and HEAD get 405.
func UsageHandler(m *Meter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, string(inference.CodeInvalidRequest), "method "+r.Method+" not allowed: use GET")
			return
		}
		s, ok := SessionFrom(r.Context())
		if !ok {
			writeError(w, http.StatusServiceUnavailable, string(inference.CodeUnavailable), "usage is not available: the endpoint is not behind API-key authentication")
			return
		}
		key, dev := m.sessionUsage(s)
		res := usageResponse{Object: "meshinfer.usage", Key: keyBrief{ID: s.KeyID, Name: s.KeyName}, Usage: key}
		if s.DeviceID != "" {
			res.Device = &deviceUsage{ID: s.DeviceID, Usage: dev}
		}
		writeJSON(w, http.StatusOK, res)
	})
}
