package receipts

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

func newKey(t testing.TB) (crypto.PrivKey, string) {
	t.Helper()
	seed := make([]byte, ed25519.SeedSize)
	rand.Read(seed)
	return keyFromSeed(t, string(seed))
}

// keyFromSeed is the ed25519 identity of seed (ed25519.SeedSize bytes) and its peer ID.
func keyFromSeed(t testing.TB, seed string) (crypto.PrivKey, string) {
	t.Helper()
	key, err := crypto.UnmarshalEd25519PrivateKey(ed25519.NewKeyFromSeed([]byte(seed)))
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return key, id.String()
}

func openLog(t *testing.T, dir string, key crypto.PrivKey) *Log {
	t.Helper()
	l, err := Open(dir, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

var t0 = time.Date(2026, 5, 1, 12, 0, 3, 250_000_000, time.UTC)

// receipt returns a sample receipt; i varies it.
func receipt(requester string, i int) Receipt {
	outcome := Completed
	if i%3 == 2 {
		outcome = "peer_lost"
	}
	return Receipt{
		Time:       t0.Add(time.Duration(i) * time.Second),
		Requester:  requester,
		Model:      []string{"synth-tiny", "synth-small"}[i%2],
		TokensIn:   10 + i,
		TokensOut:  20 + 2*i,
		DurationMS: int64(100 + i),
		Outcome:    outcome,
	}
}

type readResult struct {
	got  []Receipt
	errs []error
}

func readAll(t *testing.T, path string) readResult {
	t.Helper()
	var res readResult
	err := Read(path, func(r Receipt, err error) bool {
		if err != nil {
			var le *LineError
			if !errors.As(err, &le) {
				t.Errorf("line error %v is not a *LineError", err)
			}
			res.errs = append(res.errs, err)
		} else {
			res.got = append(res.got, r)
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func lines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

func writeLines(t *testing.T, path string, ls []string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(ls, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestAppendReadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	key, server := newKey(t)
	_, requester := newKey(t)
	l := openLog(t, dir, key)
	var want []Receipt
	for i := range 5 {
		r := receipt(requester, i)
		r.Time = r.Time.In(time.FixedZone("CEST", 2*3600)) // stored in UTC whatever the zone given
		if err := l.Append(r); err != nil {
			t.Fatal(err)
		}
		r.Time, r.Server, r.Seq = r.Time.UTC(), server, uint64(i+1)
		want = append(want, r)
	}
	res := readAll(t, filepath.Join(dir, File))
	if len(res.errs) != 0 {
		t.Fatalf("errors: %v", res.errs)
	}
	if len(res.got) != len(want) {
		t.Fatalf("read %d receipts, want %d", len(res.got), len(want))
	}
	for i, g := range res.got {
		if !strings.HasPrefix(g.Sig, "ed25519:") {
			t.Errorf("receipt %d: sig %q lacks the ed25519: prefix", i, g.Sig)
		}
		g.Sig = ""
		if g != want[i] {
			t.Errorf("receipt %d:\n got %+v\nwant %+v", i, g, want[i])
		}
	}
	for i, line := range lines(t, filepath.Join(dir, File)) {
		for _, field := range []string{`"time":"2026-05-01T12:00:0`, `Z","requester":`, `"tokens_in":`, `"duration_ms":`, `"seq":`} {
			if !strings.Contains(line, field) {
				t.Errorf("line %d %s lacks %s", i+1, line, field)
			}
		}
	}
}

// A line verifies by the recipe in doc.go, with nothing but crypto/ed25519.
func TestSignatureVerifiesByTheDocumentedRecipe(t *testing.T) {
	dir := t.TempDir()
	key, server := newKey(t)
	l := openLog(t, dir, key)
	if err := l.Append(receipt("12D3KooWrequester", 1)); err != nil {
		t.Fatal(err)
	}
	line := lines(t, filepath.Join(dir, File))[0]
	i := strings.LastIndex(line, `,"sig":"`)
	body := line[:i] + "}"
	sigText := strings.TrimSuffix(line[i+len(`,"sig":"`):], `"}`)
	sig, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(sigText, "ed25519:"))
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.Decode(server) // base58btc
	if err != nil {
		t.Fatal(err)
	}
	raw := []byte(id)
	if prefix := []byte{0x00, 0x24, 0x08, 0x01, 0x12, 0x20}; len(raw) != 38 || !bytes.HasPrefix(raw, prefix) {
		t.Fatalf("server ID bytes %x, want 38 bytes starting %x", raw, prefix)
	}
	if !ed25519.Verify(ed25519.PublicKey(raw[6:]), []byte("meshinfer/receipt/v1\n"+body), sig) {
		t.Fatalf("the documented recipe does not verify %s", line)
	}
}

func TestTamperedLineFails(t *testing.T) {
	dir := t.TempDir()
	key, server := newKey(t)
	_, other := newKey(t)
	l := openLog(t, dir, key)
	if err := l.Append(Receipt{Time: t0, Requester: "12D3KooWrequester", Model: "synth-tiny", TokensIn: 12, TokensOut: 64, DurationMS: 840, Outcome: "peer_lost"}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, File)
	orig := lines(t, path)[0]
	sigStart := strings.LastIndex(orig, `,"sig":"ed25519:`) + len(`,"sig":"ed25519:`)
	flip := []byte(orig)
	flip[sigStart] ^= 'A' ^ 'B' // one base64 character changed
	tests := []struct {
		name string
		line string
		want error
	}{
		{"tokens_out raised", strings.Replace(orig, `"tokens_out":64`, `"tokens_out":640`, 1), ErrBadSignature},
		{"outcome rewritten", strings.Replace(orig, `"outcome":"peer_lost"`, `"outcome":"completed"`, 1), ErrBadSignature},
		{"model renamed", strings.Replace(orig, `"synth-tiny"`, `"synth-big"`, 1), ErrBadSignature},
		{"time moved", strings.Replace(orig, `12:00:03.25Z`, `13:00:03.25Z`, 1), ErrBadSignature},
		{"requester changed", strings.Replace(orig, `12D3KooWrequester`, `12D3KooWsomeoneelse`, 1), ErrBadSignature},
		{"forged server ID", strings.Replace(orig, server, other, 1), ErrBadSignature},
		{"server not a peer ID", strings.Replace(orig, server, "me", 1), ErrBadSignature},
		{"signature bit flipped", string(flip), ErrBadSignature},
		{"signature truncated", strings.Replace(orig, `=="}`, `"}`, 1), ErrBadSignature},
		{"no sig", orig[:strings.LastIndex(orig, `,"sig":`)] + "}", ErrMalformed},
		{"sig not last", strings.Replace(orig, `{"time"`, `{"sig":"x","time"`, 1), ErrMalformed},
		{"whitespace added", strings.Replace(orig, `,"model"`, `, "model"`, 1), ErrMalformed},
		{"unknown field", strings.Replace(orig, `{"time"`, `{"prompt":"hi","time"`, 1), ErrMalformed},
		{"duplicate field", strings.Replace(orig, `,"model"`, `,"tokens_out":1,"model"`, 1), ErrMalformed},
		{"time not UTC", strings.Replace(orig, `12:00:03.25Z`, `14:00:03.25+02:00`, 1), ErrMalformed},
		{"torn", orig[:len(orig)/2], ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.line == orig {
				t.Fatal("the test did not change the line")
			}
			writeLines(t, path, []string{tc.line})
			res := readAll(t, path)
			if len(res.got) != 0 || len(res.errs) != 1 {
				t.Fatalf("read %d receipts and %v, want one error", len(res.got), res.errs)
			}
			if !errors.Is(res.errs[0], tc.want) {
				t.Fatalf("error %v, want %v", res.errs[0], tc.want)
			}
		})
	}
}

// A line signed by another node's key that names this node as server does not verify.
func TestForgedSignerFails(t *testing.T) {
	_, server := newKey(t)
	forger, _ := newKey(t)
	line, err := encodeLine(forger, Receipt{Time: t0, Requester: "x", Model: "m", Outcome: Completed, Server: server, Seq: 1})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), File)
	writeLines(t, path, []string{strings.TrimSuffix(string(line), "\n")})
	if res := readAll(t, path); len(res.errs) != 1 || !errors.Is(res.errs[0], ErrBadSignature) {
		t.Fatalf("read %d receipts and %v, want ErrBadSignature", len(res.got), res.errs)
	}
}

// A crash mid-write leaves a torn last line: it is reported, and the next Append starts on a
// fresh line with the seq the torn line did not get to use.
func TestTornLastLine(t *testing.T) {
	dir := t.TempDir()
	key, _ := newKey(t)
	path := filepath.Join(dir, File)
	l := openLog(t, dir, key)
	for i := range 3 {
		if err := l.Append(receipt("12D3KooWrequester", i)); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	ls := lines(t, path)
	keep := len(strings.Join(ls[:2], "\n")) + 1 + len(ls[2])/2 // mid-way through line 3
	if err := os.Truncate(path, int64(keep)); err != nil {
		t.Fatal(err)
	}

	res := readAll(t, path)
	if len(res.got) != 2 || len(res.errs) != 1 || !errors.Is(res.errs[0], ErrMalformed) || res.errs[0].(*LineError).Line != 3 {
		t.Fatalf("torn file: %d receipts, errors %v; want 2 and a malformed line 3", len(res.got), res.errs)
	}

	l = openLog(t, dir, key)
	if err := l.Append(receipt("12D3KooWrequester", 9)); err != nil {
		t.Fatal(err)
	}
	res = readAll(t, path)
	if len(res.got) != 3 || len(res.errs) != 1 || res.errs[0].(*LineError).Line != 3 {
		t.Fatalf("after the next append: %d receipts, errors %v; want 3 and line 3 torn", len(res.got), res.errs)
	}
	if got := res.got[2]; got.Seq != 3 || got.TokensIn != receipt("", 9).TokensIn {
		t.Fatalf("the receipt after the torn line is %+v, want seq 3", got)
	}
}

// A line that lost only its newline is whole: it counts, and numbering continues after it.
func TestLastLineWithoutNewline(t *testing.T) {
	dir := t.TempDir()
	key, _ := newKey(t)
	path := filepath.Join(dir, File)
	l := openLog(t, dir, key)
	for i := range 2 {
		if err := l.Append(receipt("12D3KooWrequester", i)); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	st, _ := os.Stat(path)
	if err := os.Truncate(path, st.Size()-1); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, dir, key)
	if err := l.Append(receipt("12D3KooWrequester", 2)); err != nil {
		t.Fatal(err)
	}
	res := readAll(t, path)
	if len(res.errs) != 0 || len(res.got) != 3 || res.got[2].Seq != 3 {
		t.Fatalf("%d receipts, errors %v; want seqs 1, 2, 3", len(res.got), res.errs)
	}
}

func TestConcurrentAppends(t *testing.T) {
	dir := t.TempDir()
	key, _ := newKey(t)
	l := openLog(t, dir, key)
	const writers, each = 8, 25
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if err := l.Append(receipt(fmt.Sprintf("requester-%d", w), i)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	res := readAll(t, filepath.Join(dir, File))
	if len(res.errs) != 0 || len(res.got) != writers*each {
		t.Fatalf("%d receipts, errors %v; want %d", len(res.got), res.errs, writers*each)
	}
	for i, r := range res.got {
		if r.Seq != uint64(i+1) {
			t.Fatalf("receipt %d has seq %d, want %d", i, r.Seq, i+1)
		}
	}
}

func TestReopenContinuesSeq(t *testing.T) {
	dir := t.TempDir()
	key, _ := newKey(t)
	for round := range 3 {
		l := openLog(t, dir, key)
		for i := range 2 {
			if err := l.Append(receipt("12D3KooWrequester", round*2+i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	res := readAll(t, filepath.Join(dir, File))
	if len(res.errs) != 0 || len(res.got) != 6 || res.got[5].Seq != 6 {
		t.Fatalf("%d receipts, errors %v; want seqs 1…6", len(res.got), res.errs)
	}
}

// A tail of nothing but garbage makes Open read the whole file to find where it left off.
func TestReopenAfterAGarbageTail(t *testing.T) {
	dir := t.TempDir()
	key, _ := newKey(t)
	l := openLog(t, dir, key)
	for i := range 3 {
		if err := l.Append(receipt("12D3KooWrequester", i)); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	f, err := os.OpenFile(filepath.Join(dir, File), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 * tailWindow / 1024 {
		fmt.Fprintf(f, "%s\n", strings.Repeat("x", 1023))
	}
	f.Close()
	l = openLog(t, dir, key)
	if err := l.Append(receipt("12D3KooWrequester", 3)); err != nil {
		t.Fatal(err)
	}
	res := readAll(t, filepath.Join(dir, File))
	if got := res.got[len(res.got)-1].Seq; got != 4 {
		t.Fatalf("seq after the garbage = %d, want 4", got)
	}
}

func TestSequenceErrors(t *testing.T) {
	dir := t.TempDir()
	key, _ := newKey(t)
	l := openLog(t, dir, key)
	for i := range 4 {
		if err := l.Append(receipt("12D3KooWrequester", i)); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, File)
	ls := lines(t, path)

	t.Run("copied line", func(t *testing.T) {
		writeLines(t, path, []string{ls[0], ls[1], ls[1], ls[2]})
		res := readAll(t, path)
		if len(res.got) != 3 || len(res.errs) != 1 || !errors.Is(res.errs[0], ErrSequence) || res.errs[0].(*LineError).Line != 3 {
			t.Fatalf("%d receipts, errors %v; want 3 and a sequence error on line 3", len(res.got), res.errs)
		}
	})
	t.Run("removed line", func(t *testing.T) {
		writeLines(t, path, []string{ls[0], ls[2], ls[3]})
		res := readAll(t, path)
		if len(res.got) != 3 || len(res.errs) != 1 || !errors.Is(res.errs[0], ErrSequence) || !strings.Contains(res.errs[0].Error(), "1 receipts missing") {
			t.Fatalf("%d receipts, errors %v; want 3 and one missing", len(res.got), res.errs)
		}
	})
	t.Run("altered line", func(t *testing.T) {
		// The line that fails explains the seq missing after it: one error, not two.
		writeLines(t, path, []string{ls[0], strings.Replace(ls[1], `"seq":2`, `"seq":7`, 1), ls[2], ls[3]})
		res := readAll(t, path)
		if len(res.got) != 3 || len(res.errs) != 1 || !errors.Is(res.errs[0], ErrBadSignature) {
			t.Fatalf("%d receipts, errors %v; want 3 and one bad signature", len(res.got), res.errs)
		}
	})
	t.Run("reordered", func(t *testing.T) {
		writeLines(t, path, []string{ls[1], ls[0]})
		res := readAll(t, path)
		if len(res.got) != 1 || len(res.errs) != 2 {
			t.Fatalf("%d receipts, errors %v; want 1, a gap and a sequence error", len(res.got), res.errs)
		}
	})
}

func TestTotals(t *testing.T) {
	dir := t.TempDir()
	key, _ := newKey(t)
	l := openLog(t, dir, key)
	want := Totals{ByModel: map[string]Tally{}, ByRequester: map[string]Tally{}}
	for i := range 10 {
		r := receipt(fmt.Sprintf("requester-%d", i%4), i)
		if err := l.Append(r); err != nil {
			t.Fatal(err)
		}
		want.Tasks++
		ok := 0
		if r.Outcome == Completed {
			want.Completed, ok = want.Completed+1, 1
		} else {
			want.Failed++
		}
		d := time.Duration(r.DurationMS) * time.Millisecond
		want.TokensIn += int64(r.TokensIn)
		want.TokensOut += int64(r.TokensOut)
		want.Duration += d
		for _, m := range []struct {
			tallies map[string]Tally
			key     string
		}{{want.ByModel, r.Model}, {want.ByRequester, r.Requester}} {
			tl := m.tallies[m.key]
			tl.Tasks++
			tl.Completed += ok
			tl.TokensIn += int64(r.TokensIn)
			tl.TokensOut += int64(r.TokensOut)
			tl.Duration += d
			m.tallies[m.key] = tl
		}
	}
	want.First, want.Last = t0, t0.Add(9*time.Second)
	got, errs, err := Total(filepath.Join(dir, File))
	if err != nil || len(errs) != 0 {
		t.Fatalf("Total: %v %v", err, errs)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) { // maps print sorted
		t.Fatalf("totals\n got %+v\nwant %+v", got, want)
	}
	if want.Completed != 7 || want.Failed != 3 || len(want.ByModel) != 2 || len(want.ByRequester) != 4 {
		t.Fatalf("the sample is not the mix this test means to check: %+v", want)
	}
}

func TestTotalOfAMissingFile(t *testing.T) {
	if _, _, err := Total(filepath.Join(t.TempDir(), File)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err %v, want one matching fs.ErrNotExist", err)
	}
}

func TestFileMode(t *testing.T) {
	dir := t.TempDir()
	key, _ := newKey(t)
	openLog(t, dir, key)
	st, err := os.Stat(filepath.Join(dir, File))
	if err != nil {
		t.Fatal(err)
	}
	if perm := st.Mode().Perm(); perm != 0o600 {
		t.Fatalf("mode %04o, want 0600", perm)
	}
}

// endless yields one line of n 'x' bytes and a newline, without holding it.
type endless struct{ n int }

func (e *endless) Read(p []byte) (int, error) {
	if e.n < 0 {
		return 0, io.EOF
	}
	if e.n == 0 {
		p[0], e.n = '\n', -1
		return 1, nil
	}
	k := min(len(p), e.n)
	for i := range k {
		p[i] = 'x'
	}
	e.n -= k
	return k, nil
}

// A line far longer than MaxLineSize is reported without being loaded: reading 256 MiB of it
// allocates about one buffer. The lines around it still read.
func TestOversizedLineIsSkippedUnread(t *testing.T) {
	key, _ := newKey(t)
	var before, after bytes.Buffer
	for i, w := range []*bytes.Buffer{&before, &after} {
		r := receipt("12D3KooWrequester", i)
		id, _ := peer.IDFromPrivateKey(key)
		r.Server, r.Seq = id.String(), uint64(i+1)
		line, err := encodeLine(key, r)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(line)
	}
	const huge = 256 << 20
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	var got []Receipt
	var errs []error
	err := read(io.MultiReader(&before, &endless{n: huge}, &after), func(r Receipt, err error) bool {
		if err != nil {
			errs = append(errs, err)
		} else {
			got = append(got, r)
		}
		return true
	})
	runtime.ReadMemStats(&ms1)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || len(errs) != 1 || !errors.Is(errs[0], ErrTooLong) || errs[0].(*LineError).Line != 2 {
		t.Fatalf("%d receipts, errors %v; want 2 and line 2 too long", len(got), errs)
	}
	if alloc := ms1.TotalAlloc - ms0.TotalAlloc; alloc > 4*MaxLineSize {
		t.Fatalf("reading a %d MiB line allocated %d bytes", huge>>20, alloc)
	}
}

func TestAppendRefusesAnOversizedReceipt(t *testing.T) {
	dir := t.TempDir()
	key, _ := newKey(t)
	l := openLog(t, dir, key)
	r := receipt("12D3KooWrequester", 0)
	r.Model = strings.Repeat("m", MaxLineSize)
	if err := l.Append(r); err == nil {
		t.Fatal("an oversized receipt was appended")
	}
	if err := l.Append(receipt("12D3KooWrequester", 1)); err != nil {
		t.Fatal(err)
	}
	if res := readAll(t, filepath.Join(dir, File)); len(res.errs) != 0 || len(res.got) != 1 || res.got[0].Seq != 1 {
		t.Fatalf("%d receipts, errors %v; want one with seq 1", len(res.got), res.errs)
	}
}

func TestAppendValidates(t *testing.T) {
	l := openLog(t, t.TempDir(), mustKey(t))
	for name, r := range map[string]Receipt{
		"no requester":    {Model: "m", Outcome: Completed},
		"no outcome":      {Requester: "x", Model: "m"},
		"negative tokens": {Requester: "x", Model: "m", Outcome: Completed, TokensOut: -1},
	} {
		if err := l.Append(r); err == nil {
			t.Errorf("%s: appended", name)
		}
	}
}

func mustKey(t *testing.T) crypto.PrivKey {
	k, _ := newKey(t)
	return k
}

func TestCloseIsIdempotentAndEndsAppends(t *testing.T) {
	l := openLog(t, t.TempDir(), mustKey(t))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if err := l.Append(receipt("x", 0)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Append after Close: %v, want ErrClosed", err)
	}
}

func TestOpenRefusesANonEd25519Key(t *testing.T) {
	key, _, err := crypto.GenerateSecp256k1Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(t.TempDir(), key); err == nil {
		t.Fatal("Open accepted a secp256k1 key: its receipts could not be verified from the peer ID")
	}
}

// AppendAll leaves out an invalid receipt, naming it in its error, and appends the others in
// order with sequence numbers that have no gap.
func TestAppendAllLeavesOutInvalid(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, mustKey(t))
	bad := receipt("x", 1)
	bad.Outcome = ""
	err := l.AppendAll([]Receipt{receipt("x", 0), bad, receipt("x", 3)})
	if err == nil {
		t.Fatal("AppendAll took a receipt without an outcome")
	}
	l.Close()
	var seqs []uint64
	if err := Read(filepath.Join(dir, File), func(r Receipt, err error) bool {
		if err != nil {
			t.Fatalf("line: %v", err)
		}
		seqs = append(seqs, r.Seq)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seqs, []uint64{1, 2}) {
		t.Fatalf("sequence numbers %v, want [1 2]", seqs)
	}
}
