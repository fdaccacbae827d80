package caps

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

// BenchmarkVerify measures Verify of a typical vector next to the bare ed25519 verification
// it contains (pub.Verify over the same canonical message), and reports their ratio on the
// Verify line as verify/bare: the price of strict decoding, bounds and re-encoding.
func BenchmarkVerify(b *testing.B) {
	key := seededKey(b, 7)
	v := signedVector(b, key, nil)
	data, err := Encode(v)
	if err != nil {
		b.Fatalf("Encode: %v", err)
	}
	msg := canonical(b, v)
	sig, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(v.Sig, sigPrefix))
	if err != nil {
		b.Fatalf("decode sig: %v", err)
	}
	pub := key.GetPublic()
	now := testNow()

	bare := func() {
		if ok, err := pub.Verify(msg, sig); !ok || err != nil {
			b.Fatalf("bare verify: %v %v", ok, err)
		}
	}
	b.Run("bare-ed25519", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			bare()
		}
	})
	b.Run("caps.Verify", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := Verify(data, now); err != nil {
				b.Fatalf("Verify: %v", err)
			}
		}
		ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		// The reference is timed right after the loop, so both figures of one line come from
		// the same stretch of machine load.
		n := min(b.N, 2000)
		start := time.Now()
		for range n {
			bare()
		}
		bareNS := float64(time.Since(start).Nanoseconds()) / float64(n)
		b.ReportMetric(bareNS, "bare-ns/op")
		b.ReportMetric(ns/bareNS, "verify/bare")
	})
}
