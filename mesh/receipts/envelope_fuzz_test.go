package receipts

import (
	"crypto/ed25519"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
)

// FuzzTaskEnvelope is reliability case Z6, as its replacement (docs/reliability.md). The
// catalogue asks that bad ciphertext of a coordinator's encrypted task give an error and
// never a partial plaintext; tasks are not encrypted end to end (libp2p's channel
// encryption carries them), but the coordinator's task and its result do travel in one
// authenticated envelope of ours: the serving peer's signed task receipt (the result's
// digest, the model, the token counts, the coordinator it was made out to) with the
// coordinator's countersignature and peer ID. It comes back with the result in the infer
// stream's terminal frame (ParseTask, then the executor's checks), goes to a direct
// client in direct_done, and into every usage.jsonl line that `meshinfer usage --receipts`
// reads back (VerifyCountersig). A pipeline's task travels as its stages' receipts, each
// countersigned by the coordinator, its head (ParseStage, VerifyStageCountersig).
//
// The input is the envelope's three strings (coordinator, receipt, countersignature),
// seeded with real ones: a task and a stage envelope, and forgeries made with keys (an
// attacker's envelope of its own, a receipt re-signed after a change, another peer's
// countersignature, a task receipt offered as a stage's). The property, for each verifier
// and for each receipt parser alone, is that of a ciphertext's authentication:
//
//   - it accepts the envelope exactly when some key holder signed those very bytes as that
//     kind, and then returns exactly the receipt that was signed (every signed envelope is
//     accepted: the positive control);
//   - anything else (bit flips, truncation, splices, a forgery) is an error of this
//     package's (ErrTooLong, ErrMalformed, ErrBadSignature, ErrNotTaskReceipt,
//     ErrNotStageReceipt) with a zero Receipt: nothing of a refused envelope is returned.
//
// No byte of the envelope is outside what is signed: the server signs the receipt's body,
// the coordinator's countersignature covers the whole receipt, its sig included, and the
// coordinator string must equal the requester the server signed. Verifying keeps no state
// (a fresh verifier per call), so a refused envelope changes nothing; what the coordinator
// does with a refused receipt (meter the task without it) is the executor's
// (node/dispatch's receiptFor).
//
// Keys come from fixed seeds, so that an input the fuzzer saves reproduces: with fresh keys
// each run, a saved envelope would no longer be signed.
func FuzzTaskEnvelope(f *testing.F) {
	signed, seeds := signEnvelopes(f)
	for _, e := range seeds {
		f.Add(e.coordinator, e.receipt, e.countersig)
	}
	f.Fuzz(func(t *testing.T, coordinator, receipt, countersig string) {
		signed.check(t, envelope{coordinator, receipt, countersig})
	})
}

// Every truncation of each of the real envelopes' three strings, and every byte of them
// with a bit flipped (two of its bits, rotating over the bytes, so every bit position is
// flipped along each string), is refused: the mutations a fuzzer tries first, in every test
// run. All eight bits of every byte took 16 s under -race on 2 cores; the fuzzer has the
// rest.
func TestTaskEnvelopeMutationsRefused(t *testing.T) {
	signed, seeds := signEnvelopes(t)
	n, cuts := 0, 0
	for _, e := range seeds[:2] { // the real task and stage envelopes
		for part := range 3 {
			s := [3]string{e.coordinator, e.receipt, e.countersig}
			orig := s[part]
			for i := range len(orig) {
				s[part] = orig[:i]
				signed.check(t, envelope{s[0], s[1], s[2]})
				cuts++
				for _, bit := range [2]int{i % 8, (i + 3) % 8} {
					b := []byte(orig)
					b[i] ^= 1 << bit
					s[part] = string(b)
					signed.check(t, envelope{s[0], s[1], s[2]})
					n++
				}
			}
		}
	}
	if cuts == 0 {
		t.Fatal("no envelope mutated")
	}
	t.Logf("figure Z6: %d bit flips and %d truncations of a real task and stage envelope, each refused with a typed error and a zero receipt by both verifiers and both parsers", n, cuts)
}

// signEnvelopes signs the real envelopes and the forgeries, and returns them as seeds (the
// task and the stage envelope first) with the set of what was signed.
func signEnvelopes(t testing.TB) (envelopes, []envelope) {
	t.Helper()
	server, serverID := seededKey(t, 1)
	coord, coordID := seededKey(t, 2)
	attacker, attackerID := seededKey(t, 3)
	signed := envelopes{env: map[envelope]signedAs{}, rcpt: map[string]signedAs{}}

	sign := func(kind string, key crypto.PrivKey, r Receipt) string {
		t.Helper()
		sign := SignTask
		if kind == stageKind {
			sign = SignStage
		}
		line, err := sign(key, r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := parseOne(line)
		if err != nil {
			t.Fatal(err)
		}
		signed.rcpt[line] = signedAs{kind, got}
		return line
	}
	countersign := func(key crypto.PrivKey, id, line string) string {
		t.Helper()
		sig, err := Countersign(key, line)
		if err != nil {
			t.Fatal(err)
		}
		// Both signed one record only when the receipt is made out to the countersigner.
		if as := signed.rcpt[line]; as.r.Requester == id {
			signed.env[envelope{id, line, sig}] = as
		}
		return sig
	}
	var seeds []envelope
	add := func(id, line, sig string) { seeds = append(seeds, envelope{id, line, sig}) }

	// The real envelopes: a task served for the coordinator, and a stage's part of a
	// pipeline it headed.
	task := sign(taskKind, server, taskReceipt(coordID))
	taskSig := countersign(coord, coordID, task)
	add(coordID, task, taskSig)
	stage := sign(stageKind, server, stagePart(coordID))
	stageSig := countersign(coord, coordID, stage)
	add(coordID, stage, stageSig)

	// Forgeries with keys. An attacker's own envelope is signed (accepted, for its own
	// peer ID: the coordinator's field checks refuse it as another peer's work).
	own := sign(taskKind, attacker, taskReceipt(attackerID))
	add(attackerID, own, countersign(attacker, attackerID, own))
	// The attacker countersigns the server's real receipt, made out to the coordinator.
	add(attackerID, task, countersign(attacker, attackerID, task))
	add(coordID, task, countersign(attacker, attackerID, task))
	// The server re-signs its receipt with more tokens; the countersignature is the old one.
	more := taskReceipt(coordID)
	more.TokensOut++
	add(coordID, sign(taskKind, server, more), taskSig)
	// The attacker's receipt, made out to the coordinator, in the server's name.
	forged := strings.Replace(sign(taskKind, attacker, taskReceipt(coordID)), `"server":"`+attackerID, `"server":"`+serverID, 1)
	add(coordID, forged, taskSig)
	// The kinds crossed: a task receipt with a stage's countersignature and the other way
	// round (each verifier is tried on every input, so each envelope is offered as both).
	add(coordID, task, stageSig)
	add(coordID, stage, taskSig)
	// Cut, padded and re-encoded.
	add(coordID, task[:len(task)/2], taskSig)
	add(coordID, task+" ", taskSig)
	add(coordID, strings.Replace(task, `"model":"synth-tiny"`, `"model":"synth-tin\u0079"`, 1), taskSig)
	add(coordID, task, taskSig[:len(taskSig)-2]+"==")
	add(coordID+"x", task, taskSig)
	add("", "", "")
	return signed, seeds
}

const (
	taskKind  = "task"
	stageKind = "stage"
)

// envelope is what travels: the coordinator's peer ID, the receipt and the countersignature.
type envelope struct{ coordinator, receipt, countersig string }

// signedAs is what a key holder signed: the kind and the receipt as it was signed.
type signedAs struct {
	kind string
	r    Receipt
}

// envelopes is everything the fuzz target signed, by envelope and by receipt line.
type envelopes struct {
	env  map[envelope]signedAs
	rcpt map[string]signedAs
}

// check asserts the property for env, through each kind's verifier and its receipt parser
// alone.
func (s envelopes) check(t *testing.T, env envelope) {
	t.Helper()
	verifiers := [...]struct {
		kind   string
		parse  func(string) (Receipt, error)                             // as the coordinator takes what a peer sends
		verify func(countersigner, receipt, sig string) (Receipt, error) // as a client or `meshinfer usage --receipts`
	}{
		{taskKind, ParseTask, VerifyCountersig},
		{stageKind, ParseStage, VerifyStageCountersig},
	}
	for _, k := range verifiers {
		r, err := k.verify(env.coordinator, env.receipt, env.countersig)
		want, ok := s.env[env]
		holds(t, "envelope", k.kind, r, err, want, ok && want.kind == k.kind, env)
		r, err = k.parse(env.receipt)
		want, ok = s.rcpt[env.receipt]
		holds(t, "receipt", k.kind, r, err, want, ok && want.kind == k.kind, env)
	}
}

// holds asserts the property for one verification as kind: accepted exactly when signed so
// (signed), as the receipt that was signed (want); refused with a typed error and a zero
// Receipt.
func holds(t *testing.T, what, kind string, r Receipt, err error, want signedAs, signed bool, env envelope) {
	t.Helper()
	switch {
	case err == nil && !signed:
		t.Fatalf("%s accepted as %s, but nobody signed it so: %+v\nenvelope %q", what, kind, r, env)
	case err == nil && !reflect.DeepEqual(r, want.r):
		t.Fatalf("%s accepted as %s, but not as signed: %+v, signed %+v", what, kind, r, want.r)
	case err != nil && signed:
		t.Fatalf("signed %s refused as %s: %v\nenvelope %q", what, kind, err, env)
	case err != nil && !reflect.DeepEqual(r, Receipt{}):
		t.Fatalf("%s refused as %s (%v), but part of it returned: %+v", what, kind, err, r)
	case err != nil && !typedErr(err):
		t.Fatalf("%s refused as %s with an untyped error: %v", what, kind, err)
	}
}

// typedErr reports whether err is one of the errors this package documents for a receipt
// or envelope that does not hold.
func typedErr(err error) bool {
	for _, e := range []error{ErrTooLong, ErrMalformed, ErrBadSignature, ErrNotTaskReceipt, ErrNotStageReceipt} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// seededKey is an ed25519 identity from a fixed seed (byte n repeated) and its peer ID.
func seededKey(t testing.TB, n byte) (crypto.PrivKey, string) {
	t.Helper()
	return keyFromSeed(t, strings.Repeat(string([]byte{n}), ed25519.SeedSize))
}
