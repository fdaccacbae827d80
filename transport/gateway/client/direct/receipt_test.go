package direct

import (
	"errors"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
)

// A receipt that names another output than the tokens received is reported; one that names
// them, or none at all, is not.
func TestCheckReceipt(t *testing.T) {
	sent := []inference.Token{{Index: 0, ID: 4, Text: "a"}, {Index: 1, ID: 9, Text: " mesh"}}
	other := []inference.Token{{Index: 0, ID: 4, Text: "a"}, {Index: 1, ID: 8, Text: " node"}}
	receipt := func(toks []inference.Token) string {
		return `{"model":"synth-tiny","result":"` + inference.DigestOf(toks).String() + `","server":"12D3KooWX"}`
	}
	got := inference.DigestOf(sent)
	for _, tt := range []struct {
		name, receipt string
		mismatch      bool
	}{
		{"names what was received", receipt(sent), false},
		{"no receipt: unmetered", "", false},
		{"names another output", receipt(other), true},
		{"no result", `{"model":"synth-tiny"}`, true},
		{"not JSON", "ed25519:abc", true},
	} {
		if err := checkReceipt(tt.receipt, got); (err != nil) != tt.mismatch || (err != nil && !errors.Is(err, ErrReceiptMismatch)) {
			t.Errorf("%s: %v, want mismatch %v", tt.name, err, tt.mismatch)
		}
	}
}
