package synth

import "github.com/meshinfer/meshinfer/inference"

// Vocabulary layout, the same for every preset (Vocab only sets how many syllables follow):
//
//	0                  end of text
//	1 … 4              role markers: system, developer, user, assistant (chat template)
//	5 … 260            one token per byte value 0…255 (the fallback that makes encoding total)
//	261 … Vocab−1      pseudo-syllables, e.g. "ka", " bre", "thoung"
const (
	idEOT          = 0
	idRoleBase     = 1
	idByteBase     = idRoleBase + 4
	idSyllableBase = idByteBase + 256
	// maxPieceLen is the longest syllable, in bytes: a space, a 2-letter onset, a 2-letter
	// nucleus and a 2-letter coda.
	maxPieceLen = 7
)

// tokenizer maps text to token ids and ids to text. It is deterministic and lossless
// (decoding an encoding gives the input back byte for byte) but linguistically meaningless:
// its syllables are an enumeration, not learned from any text.
type tokenizer struct {
	// pieces[id] is the text of token id; "" for end of text and the role markers.
	pieces []string
	// lookup maps each syllable piece (all at least 2 bytes) to its id, for encoding.
	lookup map[string]int
	// sampleable[id] says whether the model may output id: end of text, the syllables, and
	// the bytes of printable ASCII and newline. Role markers and other bytes are never
	// sampled, so output is always printable text.
	sampleable []bool
}

// syllableCapacity is how many distinct syllables the enumeration yields, which bounds a
// preset's vocabulary at idSyllableBase+syllableCapacity.
const syllableCapacity = 2*24*12*10 - 6

func newTokenizer(vocab int) *tokenizer {
	onsets := [24]string{"", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n",
		"p", "r", "s", "t", "v", "w", "z", "br", "ch", "st", "th", "sh"}
	nuclei := [12]string{"a", "e", "i", "o", "u", "y", "ai", "ea", "ou", "io", "ee", "oo"}
	codas := [10]string{"", "n", "r", "s", "t", "l", "m", "nd", "st", "ng"}

	t := &tokenizer{
		pieces:     make([]string, vocab),
		lookup:     make(map[string]int, vocab),
		sampleable: make([]bool, vocab),
	}
	t.sampleable[idEOT] = true
	for b := range 256 {
		t.pieces[idByteBase+b] = string([]byte{byte(b)})
		t.sampleable[idByteBase+b] = b == '\n' || (b >= 0x20 && b < 0x7f)
	}
	// Enumerate syllables so that even a small vocabulary mixes onsets and nuclei: the
	// lowest bit picks a leading space, then onset, nucleus and coda vary slowest last.
	id := idSyllableBase
	for k := 0; id < vocab; k++ {
		space, rest := k%2, k/2
		o, n, c := rest%len(onsets), rest/len(onsets)%len(nuclei), rest/(len(onsets)*len(nuclei))
		s := onsets[o] + nuclei[n] + codas[c]
		if space == 1 {
			s = " " + s
		}
		if len(s) < 2 {
			continue // a bare vowel is already a byte token
		}
		t.pieces[id] = s
		t.lookup[s] = id
		t.sampleable[id] = true
		id++
	}
	return t
}

// encode appends the tokens of s to dst: at each position the longest syllable that
// matches, else the byte's own token. It stops once dst holds more than limit tokens.
func (t *tokenizer) encode(dst []int, s string, limit int) []int {
	for i := 0; i < len(s) && len(dst) <= limit; {
		id, n := idByteBase+int(s[i]), 1
		for l := min(maxPieceLen, len(s)-i); l >= 2; l-- {
			if v, ok := t.lookup[s[i:i+l]]; ok {
				id, n = v, l
				break
			}
		}
		dst = append(dst, id)
		i += n
	}
	return dst
}

// encodeChat applies the chat template: each message is its role marker followed by its
// content, and a final assistant marker asks the model to reply. It stops once the prompt
// holds more than limit tokens; the caller treats that as an overflow. Roles must have been
// validated.
func (t *tokenizer) encodeChat(msgs []inference.Message, limit int) []int {
	var ids []int
	for _, m := range msgs {
		if len(ids) > limit {
			break
		}
		ids = append(ids, roleID(m.Role))
		ids = t.encode(ids, m.Content, limit)
	}
	return append(ids, roleID(inference.RoleAssistant))
}

func roleID(role string) int {
	switch role {
	case inference.RoleSystem:
		return idRoleBase
	case inference.RoleDeveloper:
		return idRoleBase + 1
	case inference.RoleUser:
		return idRoleBase + 2
	}
	return idRoleBase + 3 // assistant
}

// decode returns the text of ids, concatenated.
func (t *tokenizer) decode(ids []int) string {
	var b []byte
	for _, id := range ids {
		b = append(b, t.pieces[id]...)
	}
	return string(b)
}
