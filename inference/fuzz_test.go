package inference

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzRequestJSON: decoding any bytes into a Request and validating it never panics; a
// request that validates survives an encode/decode round trip unchanged, and still validates.
func FuzzRequestJSON(f *testing.F) {
	for _, seed := range []string{
		`{"model":"synth-tiny","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"system","content":null},{"role":"user","content":[{"type":"text","text":"a"}]}],"max_tokens":5,"temperature":0,"top_p":1,"seed":42,"stop":"x","stream":true}`,
		`{"model":"m","messages":[{"role":"user","content":"\u00e9\ud83d\ude00"}],"stop":["a","b"],"max_completion_tokens":3}`,
		`{"model":"m","messages":[],"max_tokens":-1,"temperature":3,"top_p":0}`,
		`{"model":"m","messages":[{"role":"tool","content":"x"}],"stop":["","b","c","d","e"]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"seed":9223372036854775807,"temperature":1e-320}`,
		`[]`, `null`, `{"messages":null}`, `{"stop":[]}`, "",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Request
		if err := json.Unmarshal(data, &r); err != nil {
			return
		}
		if err := r.Validate(Limits{}); err != nil {
			if CodeOf(err) != CodeInvalidRequest {
				t.Fatalf("Validate returned %v, not an invalid_request error", err)
			}
			return
		}
		enc, err := json.Marshal(&r)
		if err != nil {
			t.Fatalf("Marshal of a valid request: %v", err)
		}
		var back Request
		if err := json.Unmarshal(enc, &back); err != nil {
			t.Fatalf("Unmarshal(%s): %v", enc, err)
		}
		if !reflect.DeepEqual(r, back) {
			t.Fatalf("round trip changed the request:\n%+v\n%+v\nvia %s", r, back, enc)
		}
		if err := back.Validate(Limits{}); err != nil {
			t.Fatalf("round-tripped request no longer validates: %v", err)
		}
	})
}
