package inference

// Verdict is the outcome of a sampled verification of one mesh result (the executor in
// node/dispatch runs it; a coordinator's meter records it with the task).
type Verdict string

// Verdicts. The zero value means the task was not sampled.
const (
	VerdictPassed       Verdict = "passed"       // another execution gave the same output
	VerdictFailed       Verdict = "failed"       // two other executions agreed against it
	VerdictInconclusive Verdict = "inconclusive" // no decision: outputs all differ, or an execution failed
	VerdictSkipped      Verdict = "skipped"      // sampled, but no other peer could run it, or too many running
)

// Valid reports whether v is one of the verdicts or empty (not sampled).
func (v Verdict) Valid() bool {
	switch v {
	case "", VerdictPassed, VerdictFailed, VerdictInconclusive, VerdictSkipped:
		return true
	}
	return false
}

// Judge decides between the digests of two or three executions of one request, the first
// being the output under verification. All equal: nobody is wrong (odd -1). Two that differ
// are not settled: a third execution must decide. Of three, the one that differs from the
// two equal others is odd; three different ones are not settled, and neither is fewer than
// two.
func Judge(sums []Digest) (odd int, settled bool) {
	switch len(sums) {
	case 2:
		if sums[0] == sums[1] {
			return -1, true
		}
	case 3:
		a, b, c := sums[0], sums[1], sums[2]
		switch {
		case a == b && b == c:
			return -1, true
		case a == b:
			return 2, true
		case a == c:
			return 1, true
		case b == c:
			return 0, true
		}
	}
	return -1, false
}
