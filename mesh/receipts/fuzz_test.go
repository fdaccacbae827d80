package receipts

import (
	"bytes"
	"testing"

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
