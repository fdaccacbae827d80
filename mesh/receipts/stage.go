package receipts

import (
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"
)

// Stage receipts.
//
// A pipeline stage's part of a task is receipted like a task a peer served: the stage
// signs a Receipt with its Stage member (its layers, steps and positions, and the pipeline
// session's ID), no result and no seq, in the same form and with the same Domain as a log
// line, and sends it to the pipeline's head when the head closes the pipeline in order
// (transport/stage carries it): that is a stage receipt. Its own log gets the session's
// line with the same time and stage member (and a seq). A stage sees hidden states, not
// tokens: its token counts are 0 and it names no result.
//
// The head checks the stage receipt against what it asked and ran (CheckStage) and
// countersigns it (Countersign), as a requester does a task receipt; anyone holding the
// receipt, the countersignature and the head's peer ID can check that both sides signed one
// record (VerifyStageCountersig).

// ErrNotStageReceipt is returned by ParseStage for a well-signed receipt that is not a
// stage receipt: it has a seq, a result, token counts, or no stage member.
var ErrNotStageReceipt = errors.New("not a stage receipt")

// ErrMismatch is returned by CheckStage for a stage receipt, signed as it should be, that
// states something other than what the head expected.
var ErrMismatch = errors.New("stage receipt does not match the session")

// SignStage returns the stage receipt of r: r with Server set to key's peer ID and no Seq,
// signed by key, at most MaxTaskReceipt bytes. r must carry a Stage, no Result and no
// tokens.
func SignStage(key crypto.PrivKey, r Receipt) (string, error) {
	if !stageForm(r) {
		return "", fmt.Errorf("stage receipt: %w", ErrNotStageReceipt)
	}
	return signOne(key, r, "stage receipt")
}

// stageForm reports whether r, seq aside, has a stage receipt's form.
func stageForm(r Receipt) bool {
	return r.Stage != nil && r.Result == "" && r.TokensIn == 0 && r.TokensOut == 0
}

// ParseStage verifies a stage receipt: at most MaxTaskReceipt bytes, canonical, valid, with
// a stage member and no seq, result or tokens, signed by the key inside its server ID. It
// does not check the fields against the session (CheckStage does).
func ParseStage(line string) (Receipt, error) {
	r, err := parseOne(line)
	if err != nil {
		return Receipt{}, err
	}
	if r.Seq != 0 || !stageForm(r) {
		return Receipt{}, ErrNotStageReceipt
	}
	return r, nil
}

// CheckStage verifies a stage receipt (ParseStage) and that it states exactly what want
// does, but for the time, the duration and the signature, which are the stage's to say:
// the same server, requester (the head), model, outcome and stage member, session
// included. A receipt that verifies but states anything else is ErrMismatch. It returns
// the receipt.
func CheckStage(line string, want Receipt) (Receipt, error) {
	r, err := ParseStage(line)
	if err != nil {
		return Receipt{}, err
	}
	switch {
	case r.Server != want.Server:
		return Receipt{}, fmt.Errorf("%w: signed by %s, not %s", ErrMismatch, r.Server, want.Server)
	case r.Requester != want.Requester:
		return Receipt{}, fmt.Errorf("%w: made out to %s, not %s", ErrMismatch, r.Requester, want.Requester)
	case r.Model != want.Model:
		return Receipt{}, fmt.Errorf("%w: model %q, not %q", ErrMismatch, r.Model, want.Model)
	case r.Outcome != want.Outcome:
		return Receipt{}, fmt.Errorf("%w: outcome %q, not %q", ErrMismatch, r.Outcome, want.Outcome)
	case want.Stage == nil:
		return Receipt{}, fmt.Errorf("%w: a stage receipt where none was expected", ErrMismatch)
	case *r.Stage != *want.Stage:
		return Receipt{}, fmt.Errorf("%w: stage %+v, not %+v", ErrMismatch, *r.Stage, *want.Stage)
	}
	return r, nil
}

// VerifyStageCountersig checks that sig is the countersignature of receipt by the peer
// countersigner (a peer ID), and that receipt itself is a valid stage receipt (ParseStage)
// made out to that peer, the pipeline's head. It returns the receipt.
func VerifyStageCountersig(countersigner, receipt, sig string) (Receipt, error) {
	return verifyCountersig(ParseStage, countersigner, receipt, sig)
}
