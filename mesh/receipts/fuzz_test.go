package receipts

import (
	"bytes"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// FuzzParse: parsing never panics, and a line it accepts is exactly the line our encoder writes
// for the receipt it decoded to (one form per receipt).
func FuzzParse(f *testing.F) {
	key, _ := newKey(f)
	id, _ := peer.IDFromPrivateKey(key)
	for i := range 3 {
		r := receipt("12D3KooWrequester", i)
		r.Server, r.Seq = id.String(), uint64(i+1)
		line, err := encodeLine(key, r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(bytes.TrimSuffix(line, []byte{'\n'}))
	}
	f.Add([]byte(`{"sig":"ed25519:"}`))
	f.Add([]byte(`,"sig":"`))
	f.Fuzz(func(t *testing.T, line []byte) {
		var v verifier
		r, err := v.parse(line)
		if err != nil {
			return
		}
		again, err := encodeLine(key, r)
		if err != nil {
			t.Fatalf("accepted %q but cannot re-encode it: %v", line, err)
		}
		// Only the signature may differ (ed25519 is deterministic, but the key may not be the
		// signer's): compare the bodies.
		body := func(b []byte) []byte { return b[:bytes.LastIndex(b, []byte(sigMember))] }
		if !bytes.Equal(body(again), body(line)) {
			t.Fatalf("accepted a non-canonical line:\n%s\nre-encodes as\n%s", line, again)
		}
	})
}

// FuzzParseTask: a task receipt from a peer never panics the parser, and one it accepts has
// a result, no seq, and is exactly what SignTask writes for the receipt it decoded to.
func FuzzParseTask(f *testing.F) {
	key, _ := newKey(f)
	for i := range 3 {
		r := receipt("12D3KooWrequester", i)
		r.Result = sampleResult
		line, err := SignTask(key, r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(line)
	}
	f.Add(`{"result":"sha256:","sig":"ed25519:"}`)
	f.Fuzz(func(t *testing.T, line string) {
		r, err := ParseTask(line)
		if err != nil {
			return
		}
		if r.Result == "" || r.Seq != 0 {
			t.Fatalf("accepted %q with result %q seq %d", line, r.Result, r.Seq)
		}
		reencodes(t, key, r, line)
	})
}

// reencodes checks that line, accepted as r, is the line encodeLine writes for r, but for
// the signature (key may not be the signer's): one form per receipt.
func reencodes(t *testing.T, key crypto.PrivKey, r Receipt, line string) {
	t.Helper()
	body := func(s string) string { return s[:strings.LastIndex(s, sigMember)] }
	r.Sig = ""
	again, err := encodeLine(key, r)
	if err != nil {
		t.Fatalf("accepted %q but cannot re-encode it: %v", line, err)
	}
	if body(string(again)) != body(line) {
		t.Fatalf("accepted a non-canonical receipt:\n%s\nre-encodes as\n%s", line, again)
	}
}

// FuzzParseStage: a stage receipt from a peer never panics the parser, and one it accepts
// has a stage member and neither seq, result nor tokens, and is exactly what SignStage
// writes for the receipt it decoded to.
func FuzzParseStage(f *testing.F) {
	key, _ := newKey(f)
	_, head := newKey(f)
	for i := range 3 {
		r := stagePart(head)
		r.Stage.Steps, r.Stage.Positions = i, 10*i
		if i == 2 {
			r.Stage.Session = "" // as a stage that predates sessions in receipts signs
		}
		line, err := SignStage(key, r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(line)
	}
	f.Add(`{"stage":{"lo":0,"hi":1},"sig":"ed25519:"}`)
	f.Fuzz(func(t *testing.T, line string) {
		r, err := ParseStage(line)
		if err != nil {
			return
		}
		if r.Stage == nil || r.Seq != 0 || r.Result != "" || r.TokensIn != 0 || r.TokensOut != 0 {
			t.Fatalf("accepted %q as a stage receipt: %+v", line, r)
		}
		reencodes(t, key, r, line)
	})
}
