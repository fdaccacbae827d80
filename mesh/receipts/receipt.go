package receipts

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// File is the name of the log inside the node's data dir.
const File = "receipts.jsonl"

// Domain separates receipt signatures from every other use of the node's identity key.
const Domain = "meshinfer/receipt/v1\n"

// MaxLineSize bounds one line of the log in bytes, newline included. A receipt is a few hundred
// bytes (model names are at most 256); a longer line is not one of ours and is skipped
// unread rather than loaded whole.
const MaxLineSize = 64 << 10

// Completed is the outcome of a task that ended with its result.
const Completed = "completed"

// sigPrefix names the signature scheme inside the sig field.
const sigPrefix = "ed25519:"

// sigMember introduces the sig member, always the last of a line. A JSON string value never
// contains it: its quotes would be escaped.
const sigMember = `,"sig":"`

// Receipt is one task served for another peer. It holds no prompt or output content.
type Receipt struct {
	Time      time.Time `json:"time"`      // when the task ended, UTC
	Requester string    `json:"requester"` // peer ID of the peer served
	Model     string    `json:"model"`     // the model that ran
	// Stage, present on the receipt of a pipeline stage's part of a task, is the layer
	// range it ran and how much: the requester is then the pipeline's head, and the token
	// counts are 0 (a stage sees hidden states, not tokens). Absent from every other
	// receipt, which keeps receipts written before it existed, and their signatures, as
	// they were.
	Stage      *Stage `json:"stage,omitempty"`
	TokensIn   int    `json:"tokens_in"`   // prompt tokens
	TokensOut  int    `json:"tokens_out"`  // completion tokens
	DurationMS int64  `json:"duration_ms"` // from admission to the end of the task
	Outcome    string `json:"outcome"`     // Completed or the error code
	// Result is the digest of the output sent (inference.Digest's string form), present when
	// the requester asked for a receipt: the same task's line in the log and the receipt the
	// requester got carry the same time and result.
	Result string `json:"result,omitempty"`
	Server string `json:"server"`        // peer ID of the node that served and signed
	Seq    uint64 `json:"seq,omitempty"` // 1, 2, … within the file; absent from a task receipt
	Sig    string `json:"sig,omitempty"`
}

// Stage is a pipeline stage's part of a task: layers [Lo, Hi) of the model, run for Steps
// steps over Positions positions in all (the prompt's at the first step, then one per
// generated token: the length of the stage's KV cache at the end).
type Stage struct {
	Lo        int `json:"lo"`
	Hi        int `json:"hi"`
	Steps     int `json:"steps"`
	Positions int `json:"positions"`
	// Session is the pipeline session's ID (transport/stage: 32 lowercase hex digits, chosen
	// at random by the head). It ties a stage receipt to the one session it is about, so
	// that a head never takes an earlier session's receipt for this one's, and the stage's
	// log line to the receipt its head countersigned. Absent from lines written before it
	// existed, which verify as they did.
	Session string `json:"session,omitempty"`
}

// sessionLen is the length of a Stage's Session in hex digits (16 bytes).
const sessionLen = 32

// Label is model with r's layer range when r is a stage's part, inclusive like a
// pipeline's route: "synth-large[0-7]"; model alone otherwise.
func (r *Receipt) Label() string {
	if r.Stage == nil {
		return r.Model
	}
	return fmt.Sprintf("%s[%d-%d]", r.Model, r.Stage.Lo, r.Stage.Hi-1)
}

// Errors reported for a line by Read, inside a *LineError.
var (
	ErrTooLong      = errors.New("receipt line too long")
	ErrMalformed    = errors.New("receipt malformed or torn")
	ErrBadSignature = errors.New("receipt signature invalid")
	ErrSequence     = errors.New("receipt out of sequence")
)

// LineError is the error for one line of a log; Line counts from 1.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }
func (e *LineError) Unwrap() error { return e.Err }

// canonical returns the body a signature covers (without Domain): r encoded without sig.
func canonical(r Receipt) ([]byte, error) {
	r.Sig = ""
	b, err := json.Marshal(&r)
	if err != nil {
		return nil, fmt.Errorf("encode receipt: %w", err)
	}
	return b, nil
}

// validate checks the values a receipt must have, signed or not.
func validate(r *Receipt) error {
	switch {
	case r.Time.IsZero() || r.Time.Location() != time.UTC:
		return errors.New("time is zero or not UTC")
	case r.Requester == "":
		return errors.New("requester is empty")
	case r.Outcome == "":
		return errors.New("outcome is empty")
	case r.TokensIn < 0 || r.TokensOut < 0 || r.DurationMS < 0:
		return errors.New("negative count")
	case r.Result != "" && !validResult(r.Result):
		return errors.New("result is not sha256: and 64 lowercase hex digits")
	case r.Stage != nil && (r.Stage.Lo < 0 || r.Stage.Hi <= r.Stage.Lo || r.Stage.Steps < 0 || r.Stage.Positions < 0):
		return errors.New("stage is not a layer range [lo, hi) with counts of at least 0")
	case r.Stage != nil && r.Stage.Session != "" && !lowerHex(r.Stage.Session, sessionLen):
		return errors.New("stage session is not 32 lowercase hex digits")
	}
	return nil
}

// lowerHex reports whether s is n lowercase hex digits.
func lowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// validResult reports whether s is the string form of an inference.Digest.
func validResult(s string) bool {
	hexPart, ok := strings.CutPrefix(s, resultPrefix)
	return ok && lowerHex(hexPart, 64)
}

// resultPrefix starts a result digest (inference.DigestPrefix; this package does not import
// inference).
const resultPrefix = "sha256:"

// encodeLine returns the signed line for r (Server and Seq set), newline included.
func encodeLine(key crypto.PrivKey, r Receipt) ([]byte, error) {
	body, err := canonical(r)
	if err != nil {
		return nil, err
	}
	sig, err := key.Sign(append([]byte(Domain), body...))
	if err != nil {
		return nil, fmt.Errorf("sign receipt: %w", err)
	}
	line := make([]byte, 0, len(body)+len(sigMember)+len(sigPrefix)+base64.StdEncoding.EncodedLen(len(sig))+3)
	line = append(line, body[:len(body)-1]...) // body without its closing brace
	line = append(line, sigMember...)
	line = append(line, sigPrefix...)
	line = base64.StdEncoding.AppendEncode(line, sig)
	return append(line, "\"}\n"...), nil
}

// verifier checks lines, keeping the last server's public key: a log holds one server's lines.
type verifier struct {
	server string
	pub    crypto.PubKey
}

func (v *verifier) key(server string) (crypto.PubKey, error) {
	if v.pub != nil && server == v.server {
		return v.pub, nil
	}
	id, err := peer.Decode(server)
	if err != nil {
		return nil, fmt.Errorf("%w: server: %w", ErrBadSignature, err)
	}
	pub, err := id.ExtractPublicKey()
	if err != nil {
		return nil, fmt.Errorf("%w: server ID carries no public key: %w", ErrBadSignature, err)
	}
	if pub.Type() != crypto.Ed25519 {
		return nil, fmt.Errorf("%w: server key type %v is not ed25519", ErrBadSignature, pub.Type())
	}
	v.server, v.pub = server, pub
	return pub, nil
}

// parse decodes one line of a log (without its newline) and verifies it: strict JSON,
// canonical form, valid values, a seq, and a signature by the key inside the server ID over
// exactly the line's body.
func (v *verifier) parse(line []byte) (Receipt, error) {
	r, err := v.parseAny(line)
	if err == nil && r.Seq == 0 {
		return Receipt{}, fmt.Errorf("%w: seq missing", ErrMalformed)
	}
	return r, err
}

// parseAny is parse without the seq requirement: it accepts task receipts too.
func (v *verifier) parseAny(line []byte) (Receipt, error) {
	if len(line) >= MaxLineSize {
		return Receipt{}, ErrTooLong
	}
	i := bytes.LastIndex(line, []byte(sigMember))
	if i < 0 || !bytes.HasSuffix(line[i+len(sigMember):], []byte(`"}`)) {
		return Receipt{}, fmt.Errorf("%w: no sig member at the end", ErrMalformed)
	}
	sigText := line[i+len(sigMember) : len(line)-2]
	body := append(line[:i:i], '}') // a copy: line[:i:i] has no room to grow in place

	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var r Receipt
	if err := dec.Decode(&r); err != nil {
		return Receipt{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Receipt{}, fmt.Errorf("%w: trailing data after the object", ErrMalformed)
	}
	if err := validate(&r); err != nil {
		return Receipt{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if r.Server == "" {
		return Receipt{}, fmt.Errorf("%w: server missing", ErrMalformed)
	}
	// The signature covers the bytes as written; requiring them to be canonical as well means
	// a receipt has one form only (no duplicate keys, reordering or stray escapes).
	if canon, err := canonical(r); err != nil || !bytes.Equal(canon, body) {
		return Receipt{}, fmt.Errorf("%w: not in canonical form", ErrMalformed)
	}

	enc, ok := bytes.CutPrefix(sigText, []byte(sigPrefix))
	if !ok {
		return Receipt{}, fmt.Errorf("%w: sig lacks %q prefix", ErrBadSignature, sigPrefix)
	}
	sig, err := base64.StdEncoding.Strict().AppendDecode(nil, enc)
	if err != nil || len(sig) != 64 {
		return Receipt{}, fmt.Errorf("%w: sig is not 64 bytes of base64", ErrBadSignature)
	}
	pub, err := v.key(r.Server)
	if err != nil {
		return Receipt{}, err
	}
	if ok, err := pub.Verify(append([]byte(Domain), body...), sig); err != nil || !ok {
		return Receipt{}, fmt.Errorf("%w: does not verify for server %s", ErrBadSignature, r.Server)
	}
	r.Sig = string(sigText)
	return r, nil
}
