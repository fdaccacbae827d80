package receipts

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Task receipts and countersignatures.
//
// A requester can ask the serving peer for a receipt of its task (a coordinator always does).
// The peer signs a Receipt with the output's digest in Result and no Seq, in the same form and
// with the same Domain as a log line, and sends it with the task's result: that is a task
// receipt. Its own log gets the task's line with the same time and result (and a seq), so
// the peer can match the requester's record to its own.
//
// The requester checks the task receipt (ParseTask, then its fields against what it
// received) and countersigns it: an ed25519 signature by the requester's identity key over
// CounterDomain followed by the receipt's bytes exactly. Anyone holding the receipt, the
// countersignature and the requester's peer ID can check that both sides signed one record
// (VerifyCountersig).

// CounterDomain separates countersignatures from every other use of a node's identity key.
const CounterDomain = "meshinfer/countersig/v1\n"

// MaxTaskReceipt bounds a task receipt in bytes: a model name of 256 bytes escaped in full,
// two peer IDs, a digest and a signature stay under 2 KiB.
const MaxTaskReceipt = 2 << 10

// ErrNotTaskReceipt is returned by ParseTask for a well-signed receipt that is not a task
// receipt: it has a seq, no result, or a stage member (a stage receipt's).
var ErrNotTaskReceipt = errors.New("not a task receipt")

// SignTask returns the task receipt of r: r with Server set to key's peer ID and no Seq,
// signed by key. r must carry a Result, and no Stage.
func SignTask(key crypto.PrivKey, r Receipt) (string, error) {
	switch {
	case r.Result == "":
		return "", fmt.Errorf("task receipt: %w: no result", ErrNotTaskReceipt)
	case r.Stage != nil:
		return "", fmt.Errorf("task receipt: %w: a stage's part (SignStage)", ErrNotTaskReceipt)
	}
	return signOne(key, r, "task receipt")
}

// signOne returns r with Server set to key's peer ID and no Seq, signed by key, as one line
// without newline of at most MaxTaskReceipt bytes: a task or stage receipt (what names it
// in errors).
func signOne(key crypto.PrivKey, r Receipt, what string) (string, error) {
	if err := validate(&r); err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	r.Server, r.Seq, r.Sig = id.String(), 0, ""
	line, err := encodeLine(key, r)
	if err != nil {
		return "", err
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	if len(line) > MaxTaskReceipt {
		return "", fmt.Errorf("%s of %d bytes over the %d byte limit", what, len(line), MaxTaskReceipt)
	}
	return string(line), nil
}

// ParseTask verifies a task receipt: canonical, valid, with a result and neither seq nor
// stage, signed by the key inside its server ID. It does not check the fields against the
// task: the caller compares Server, Requester, Result and the counts with what it knows.
func ParseTask(line string) (Receipt, error) {
	r, err := parseOne(line)
	if err != nil {
		return Receipt{}, err
	}
	if r.Seq != 0 || r.Result == "" || r.Stage != nil {
		return Receipt{}, ErrNotTaskReceipt
	}
	return r, nil
}

// parseOne verifies one receipt sent by a peer (a task or stage receipt), bounded by
// MaxTaskReceipt before it is read.
func parseOne(line string) (Receipt, error) {
	if len(line) > MaxTaskReceipt {
		return Receipt{}, ErrTooLong
	}
	var v verifier
	return v.parseAny([]byte(line))
}

// Countersign returns the countersignature of a task or stage receipt by key: "ed25519:"
// and the base64 of the signature over CounterDomain + receipt.
func Countersign(key crypto.PrivKey, receipt string) (string, error) {
	sig, err := key.Sign(append([]byte(CounterDomain), receipt...))
	if err != nil {
		return "", fmt.Errorf("countersign receipt: %w", err)
	}
	return sigPrefix + base64.StdEncoding.EncodeToString(sig), nil
}

// VerifyCountersig checks that sig is the countersignature of receipt by the peer
// countersigner (a peer ID), and that receipt itself is a valid task receipt whose requester
// is that peer. It returns the receipt.
func VerifyCountersig(countersigner, receipt, sig string) (Receipt, error) {
	return verifyCountersig(ParseTask, countersigner, receipt, sig)
}

// verifyCountersig is VerifyCountersig of a receipt that parse accepts.
func verifyCountersig(parse func(string) (Receipt, error), countersigner, receipt, sig string) (Receipt, error) {
	r, err := parse(receipt)
	if err != nil {
		return Receipt{}, err
	}
	if r.Requester != countersigner {
		return Receipt{}, fmt.Errorf("%w: countersigned by %s, but the receipt's requester is %s", ErrBadSignature, countersigner, r.Requester)
	}
	var v verifier
	pub, err := v.key(countersigner)
	if err != nil {
		return Receipt{}, err
	}
	enc, ok := bytes.CutPrefix([]byte(sig), []byte(sigPrefix))
	if !ok {
		return Receipt{}, fmt.Errorf("%w: countersignature lacks %q prefix", ErrBadSignature, sigPrefix)
	}
	raw, err := base64.StdEncoding.Strict().AppendDecode(nil, enc)
	if err != nil || len(raw) != 64 {
		return Receipt{}, fmt.Errorf("%w: countersignature is not 64 bytes of base64", ErrBadSignature)
	}
	if ok, err := pub.Verify(append([]byte(CounterDomain), receipt...), raw); err != nil || !ok {
		return Receipt{}, fmt.Errorf("%w: countersignature does not verify for %s", ErrBadSignature, countersigner)
	}
	return r, nil
}
