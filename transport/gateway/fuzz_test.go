package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// FuzzDecodeKeys: decoding never panics, and a file it accepts encodes and decodes again to
// the same keys.
func FuzzDecodeKeys(f *testing.F) {
	data, err := encodeKeys(synthetic(3))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte(`{"version":1,"keys":[]}`))
	f.Add([]byte(`{"version":1,"keys":[{"id":"key_0123abcd","name":"a","sha256":"` + strings.Repeat("0", 64) +
		`","created_at":"2026-05-01T12:00:00Z","revoked_at":"2026-05-02T12:00:00Z"}]}`))
	f.Add([]byte(`{"version":1,"keys":[{"sha256":"` + strings.Repeat("0", 200) + `"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := decodeKeys(data)
		if err != nil {
			return
		}
		again, err := encodeKeys(entries)
		if err != nil {
			t.Fatalf("accepted %q but cannot encode it: %v", data, err)
		}
		back, err := decodeKeys(again)
		if err != nil {
			t.Fatalf("our own encoding %q is refused: %v", again, err)
		}
		if len(back) != len(entries) {
			t.Fatalf("%d keys decode to %d after a round trip", len(entries), len(back))
		}
		for i := range back {
			a, b := entries[i], back[i]
			if a.ID != b.ID || a.Name != b.Name || a.hash != b.hash || !a.CreatedAt.Equal(b.CreatedAt) || !a.RevokedAt.Equal(b.RevokedAt) {
				t.Fatalf("key %d changed in a round trip: %+v, then %+v", i, a, b)
			}
		}
	})
}

// FuzzParseEvent: parsing a usage line never panics, and a line it accepts is an event that
// Record would accept, which reads back the same.
func FuzzParseEvent(f *testing.F) {
	line, err := json.Marshal(event(keyA, OutcomeCompleted, 12, 64, 800))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(line)
	f.Add(line[:len(line)/2])
	f.Add([]byte(`{"time":"2026-05-01T12:00:00Z","key_id":"key_0000000a","outcome":"verification_failed","tokens_in":9}`))
	f.Add([]byte(`{"time":"2026-05-01T12:00:00Z","key_id":"key_0000000a","device":"dev_0123456789abcdef0123456789abcdef","outcome":"completed"}`))
	f.Add([]byte(`{"time":"2026-05-01T12:00:00Z","key_id":"key_0000000a","device":"a b","outcome":"completed"}`))
	f.Add([]byte(`{"time":"2026-05-01T12:00:00Z","key_id":"key_0000000a","outcome":"completed","peer":"pipeline:a[0-1],b[2-3]",` +
		`"stage_receipts":[{"receipt":"{}","countersig":"ed25519:x"},{"receipt":"","countersig":""}],"coordinator":"12D3KooWc"}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		e, err := parseEvent(line)
		if err != nil {
			return
		}
		if err := e.validate(); err != nil {
			t.Fatalf("accepted %q, which Record would refuse: %v", line, err)
		}
		again, err := json.Marshal(&e)
		if err != nil {
			t.Fatal(err)
		}
		back, err := parseEvent(again)
		if err != nil || !back.Time.Equal(e.Time) {
			t.Fatalf("%q re-encodes as %q, which reads as %+v, %v", line, again, back, err)
		}
		back.Time = e.Time // the same instant; the zone may be spelled differently
		if !reflect.DeepEqual(back, e) {
			t.Fatalf("round trip changed the event: %+v, then %+v", e, back)
		}
	})
}

// FuzzKeyFromHeader: the key headers never panic the parser, and whatever it accepts is the
// trimmed value of one of them, free of spaces; refusals match ErrKeyMissing or
// ErrKeyMalformed, and Check's form test never panics either.
func FuzzKeyFromHeader(f *testing.F) {
	f.Add("Bearer msk_live_abcdefghijklmnopqrstuvwxyz234567abcdefghijklmnopqrsa", "")
	f.Add("", "msk_live_x")
	f.Add("Basic abc", "")
	f.Add("Bearer", "Bearer x")
	f.Fuzz(func(t *testing.T, auth, alt string) {
		h := http.Header{}
		if auth != "" {
			h.Set("Authorization", auth)
		}
		if alt != "" {
			h.Set(APIKeyHeader, alt)
		}
		key, err := keyFromHeader(h)
		if err != nil {
			if !errors.Is(err, ErrKeyMissing) && !errors.Is(err, ErrKeyMalformed) {
				t.Fatalf("error %v matches neither ErrKeyMissing nor ErrKeyMalformed", err)
			}
			return
		}
		if key == "" || strings.TrimSpace(key) != key || !strings.Contains(auth, key) && !strings.Contains(alt, key) {
			t.Fatalf("headers %q, %q gave key %q", auth, alt, key)
		}
		if _, err := hashKey(key); err != nil && !errors.Is(err, ErrKeyMalformed) {
			t.Fatalf("hashKey(%q) = %v, want nil or ErrKeyMalformed", key, err)
		}
	})
}
