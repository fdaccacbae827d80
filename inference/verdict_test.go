package inference

import "testing"

// Two out of three decide; anything less is inconclusive and blames nobody.
func TestJudge(t *testing.T) {
	a := DigestOf([]Token{{Index: 0, Text: "mesh", ID: 7}})
	b := DigestOf([]Token{{Index: 0, Text: "mesh", ID: 8}})
	c := DigestOf([]Token{{Index: 0, Text: "node", ID: 7}})
	tests := []struct {
		name        string
		sums        []Digest
		odd         int
		wantSettled bool
	}{
		{"two agree", []Digest{a, a}, -1, true},
		{"two differ: a third must decide", []Digest{a, b}, -1, false},
		{"three agree", []Digest{a, a, a}, -1, true},
		{"the served peer lied", []Digest{b, a, a}, 0, true},
		{"the verifier lied", []Digest{a, b, a}, 1, true},
		{"the third lied", []Digest{a, a, b}, 2, true},
		{"three different outputs", []Digest{a, b, c}, -1, false},
		{"one output", []Digest{a}, -1, false},
		{"none", nil, -1, false},
	}
	for _, tt := range tests {
		odd, settled := Judge(tt.sums)
		if odd != tt.odd || settled != tt.wantSettled {
			t.Errorf("%s: Judge = (%d, %v), want (%d, %v)", tt.name, odd, settled, tt.odd, tt.wantSettled)
		}
	}
}

func TestVerdictValid(t *testing.T) {
	for _, v := range []Verdict{"", VerdictPassed, VerdictFailed, VerdictInconclusive, VerdictSkipped} {
		if !v.Valid() {
			t.Errorf("%q not valid", v)
		}
	}
	for _, v := range []Verdict{"pass", "PASSED", "verified"} {
		if v.Valid() {
			t.Errorf("%q valid", v)
		}
	}
}
