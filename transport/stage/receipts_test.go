package stage

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/reputation"
)

// The receipts in these tests are what this package carries, not mesh/receipts' format
// (which transport does not import; node wires the two and tests them together): a line
// of the session's facts as the stage states them, signed with the stage host's own
// ed25519 key, and checked at the head against the signer's peer ID like a real receipt.

// statement is what a test receipt states: a session end's facts, or a part's.
func statement(session string, head peer.ID, model string, lo, hi, steps, positions int, outcome string) string {
	return fmt.Sprintf("%s|%s|%s|%d|%d|%d|%d|%s", session, head, model, lo, hi, steps, positions, outcome)
}

// signWith signs a session end's statement with key, as "statement|signer|sig".
func signWith(key crypto.PrivKey, e SessionEnd) (string, error) {
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return "", err
	}
	text := statement(e.Session, e.Head, e.Model, e.Lo, e.Hi, e.Steps, e.Positions, e.Outcome) + "|" + id.String()
	sig, err := key.Sign([]byte(text))
	if err != nil {
		return "", err
	}
	return text + "|" + base64.StdEncoding.EncodeToString(sig), nil
}

// signer is a stage's receipt signer with its host's key: it keeps what it signed.
type signer struct {
	key crypto.PrivKey
	mu  sync.Mutex
	got []string
}

func newSigner(h host.Host) *signer { return &signer{key: h.Peerstore().PrivKey(h.ID())} }

func (s *signer) sign(e SessionEnd) (string, error) {
	r, err := signWith(s.key, e)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, r)
	return r, err
}

func (s *signer) signed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

// checker is the head's check of a test receipt: signed by the part's stage, stating
// exactly the part, completed. It keeps the parts it was asked about.
type checker struct {
	mu    sync.Mutex
	parts []Part
}

func (c *checker) check(p Part, receipt string) error {
	c.mu.Lock()
	c.parts = append(c.parts, p)
	c.mu.Unlock()
	i := strings.LastIndexByte(receipt, '|')
	if i < 0 {
		return errors.New("no signature")
	}
	text := receipt[:i]
	sig, err := base64.StdEncoding.DecodeString(receipt[i+1:])
	if err != nil {
		return err
	}
	pub, err := p.Stage.Peer.ExtractPublicKey()
	if err != nil {
		return err
	}
	if ok, err := pub.Verify([]byte(text), sig); err != nil || !ok {
		return errors.New("bad signature")
	}
	want := statement(p.Session, p.Head, p.Model, p.Stage.Lo, p.Stage.Hi, p.Steps, p.Positions, OutcomeClosed) + "|" + p.Stage.Peer.String()
	if text != want {
		return fmt.Errorf("states %q, want %q", text, want)
	}
	return nil
}

func (c *checker) asked() []Part {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Part(nil), c.parts...)
}

// signWithSigner is a stage's signing function made from its signer: its own sign, or one
// that lies or fails; nil for none (a stage without receipts).
type signWithSigner func(*signer) func(SessionEnd) (string, error)

// newSigningStage is newStage with a receipt signer of the stage host's key, or what sign
// makes of it.
func newSigningStage(t *testing.T, be *arith, sign signWithSigner, opts ...ServerOption) (*stageNode, *signer) {
	t.Helper()
	n := &stageNode{h: newHost(t), be: be, ends: make(chan SessionEnd, 64)}
	sg := newSigner(n.h)
	fn := sg.sign
	if sign != nil {
		fn = sign(sg)
	}
	opts = append(opts, WithOnSessionEnd(func(e SessionEnd) { n.ends <- e }))
	if fn != nil {
		opts = append(opts, WithReceiptSigner(fn))
	}
	n.srv = NewServer(n.h, be, opts...)
	t.Cleanup(func() { n.srv.Close() })
	return n, sg
}

// receiptedChain starts a stage per range, each signing its receipts with its host's key
// (unless signs[i] replaces it), its signer returned by index.
func receiptedChain(t *testing.T, layers, width int, ranges [][2]int, signs map[int]signWithSigner) (chain, []*signer) {
	t.Helper()
	c := chain{head: newHost(t)}
	var signers []*signer
	for i, r := range ranges {
		n, sg := newSigningStage(t, newArith(layers, width, 8), signs[i])
		know(c.head, n.h)
		c.stages = append(c.stages, n)
		c.hops = append(c.hops, Hop{Peer: n.h.ID(), Lo: r[0], Hi: r[1]})
		signers = append(signers, sg)
	}
	return c, signers
}

// A chain whose stages all sign receipts gives the head, once it closes the pipeline in
// order, each stage's receipt as the stage signed it, checked against what the head ran:
// the stage's peer and layers, the model, the session, its steps and positions. Each
// stage signs once, for the session end its own report gets (same time, same counts).
func TestReceiptedChainReturnsEachStagesReceipt(t *testing.T) {
	const layers, width, promptLen, decode = 6, 16, 11, 5
	prompt := promptStates(promptLen, width)
	want := local(t, layers, width, prompt, decode)
	c, signers := receiptedChain(t, layers, width, [][2]int{{0, 1}, {1, 4}, {4, 6}}, nil)
	var ck checker
	var seen observed
	p := c.open(t, 64, WithReceipts(ck.check), WithPipelineObserver(&seen))
	got, err := generate(t.Context(), p.Forward, width, prompt, decode)
	if err != nil {
		t.Fatal(err)
	}
	if !sameBits(got, want) {
		t.Fatal("a receipted chain's outputs differ from one process's")
	}
	if rs := p.Receipts(); rs != nil {
		t.Fatalf("receipts before Close: %q", rs)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	rs := p.Receipts()
	if len(rs) != 3 {
		t.Fatalf("%d receipts, want 3", len(rs))
	}
	parts := ck.asked()
	if len(parts) != 3 {
		t.Fatalf("the head checked %d receipts, want 3", len(parts))
	}
	for i, n := range c.stages {
		e := n.freed(t, OutcomeClosed)
		signed := signers[i].signed()
		if len(signed) != 1 || rs[i] != signed[0] {
			t.Fatalf("stage %d signed %q; the head kept %q", i, signed, rs[i])
		}
		if !strings.HasPrefix(rs[i], statement(e.Session, c.head.ID(), arithModel, c.hops[i].Lo, c.hops[i].Hi, 1+decode, promptLen+decode, OutcomeClosed)) {
			t.Fatalf("stage %d's receipt %q is not of its session end %+v", i, rs[i], e)
		}
		pt := parts[i]
		if pt.Index != i || pt.Stage != c.hops[i] || pt.Head != c.head.ID() || pt.Model != arithModel || pt.Session != e.Session ||
			pt.Steps != 1+decode || pt.Positions != promptLen+decode {
			t.Fatalf("the head checked stage %d's receipt against %+v, its session end is %+v", i, pt, e)
		}
		if e.Time.IsZero() || e.Duration < 0 {
			t.Fatalf("stage %d's session end time %v, duration %v", i, e.Time, e.Duration)
		}
	}
	if got := seen.events(); len(got) != 0 {
		t.Fatalf("observed %q after an honest chain", got)
	}
}

// A chain with a stage that does not sign receipts (one that predates them, or has no
// signer), wherever it is, gives none and runs as before: the same outputs, an orderly
// end at every stage, no signature asked of anyone; nor does a head that asks for none.
func TestChainWithAStageWithoutReceipts(t *testing.T) {
	const layers, width, promptLen, decode = 6, 16, 7, 3
	prompt := promptStates(promptLen, width)
	want := local(t, layers, width, prompt, decode)
	for old := -1; old < 3; old++ {
		name := fmt.Sprintf("stage %d without", old)
		if old < 0 {
			name = "head asks for none"
		}
		t.Run(name, func(t *testing.T) {
			none := signWithSigner(func(*signer) func(SessionEnd) (string, error) { return nil })
			c, signers := receiptedChain(t, layers, width, [][2]int{{0, 2}, {2, 3}, {3, 6}},
				map[int]signWithSigner{old: none})
			var opts []PipelineOption
			var ck checker
			if old >= 0 {
				opts = append(opts, WithReceipts(ck.check))
			}
			p := c.open(t, 64, opts...)
			got, err := generate(t.Context(), p.Forward, width, prompt, decode)
			if err != nil {
				t.Fatal(err)
			}
			if !sameBits(got, want) {
				t.Fatal("the outputs differ")
			}
			p.Close()
			if rs := p.Receipts(); rs != nil {
				t.Fatalf("receipts %q from a chain that gives none", rs)
			}
			for i, n := range c.stages {
				n.freed(t, OutcomeClosed)
				if s := signers[i].signed(); len(s) != 0 {
					t.Fatalf("stage %d signed %q", i, s)
				}
			}
			if len(ck.asked()) != 0 {
				t.Fatal("the head checked receipts of a chain that gives none")
			}
		})
	}
}

// The head keeps only receipts that hold. A stage that signs a wrong statement, signs
// with another key or sends bytes that are no signature has its receipt dropped and the
// violation recorded against it; the other stages' receipts are kept. A stage that cannot
// sign (its signer fails, or its receipt is over MaxReceipt) sends none: dropped, not
// recorded.
func TestHeadDropsReceiptsThatDoNotHold(t *testing.T) {
	const layers, width = 6, 16
	otherKey, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	lie := func(change func(*SessionEnd)) signWithSigner {
		return func(s *signer) func(SessionEnd) (string, error) {
			return func(e SessionEnd) (string, error) { change(&e); return signWith(s.key, e) }
		}
	}
	tests := []struct {
		name     string
		sign     signWithSigner
		recorded bool
	}{
		{"more steps", lie(func(e *SessionEnd) { e.Steps++ }), true},
		{"fewer positions", lie(func(e *SessionEnd) { e.Positions-- }), true},
		{"other layers", lie(func(e *SessionEnd) { e.Lo++ }), true},
		{"other model", lie(func(e *SessionEnd) { e.Model = "other" }), true},
		{"other session", lie(func(e *SessionEnd) { e.Session = strings.Repeat("0", 32) }), true},
		{"other head", lie(func(e *SessionEnd) { e.Head = e.From }), true},
		{"another key", func(*signer) func(SessionEnd) (string, error) {
			return func(e SessionEnd) (string, error) { return signWith(otherKey, e) }
		}, true},
		{"no signature", func(*signer) func(SessionEnd) (string, error) {
			return func(SessionEnd) (string, error) { return "{}", nil }
		}, true},
		{"signer fails", func(*signer) func(SessionEnd) (string, error) {
			return func(SessionEnd) (string, error) { return "", errors.New("no key") }
		}, false},
		{"over MaxReceipt", func(*signer) func(SessionEnd) (string, error) {
			return func(SessionEnd) (string, error) { return strings.Repeat("x", MaxReceipt+1), nil }
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, signers := receiptedChain(t, layers, width, [][2]int{{0, 2}, {2, 3}, {3, 6}},
				map[int]signWithSigner{1: tt.sign})
			var ck checker
			var seen observed
			p := c.open(t, 64, WithReceipts(ck.check), WithPipelineObserver(&seen))
			if _, err := generate(t.Context(), p.Forward, width, promptStates(3, width), 2); err != nil {
				t.Fatal(err)
			}
			p.Close()
			rs := p.Receipts()
			if len(rs) != 3 || rs[1] != "" || rs[0] != signers[0].signed()[0] || rs[2] != signers[2].signed()[0] {
				t.Fatalf("receipts %q: want stage 1's dropped, the others kept", rs)
			}
			var want []string
			if tt.recorded {
				want = []string{c.hops[1].Peer.String() + " " + reputation.ProtocolViolation.String()}
			}
			if got := seen.events(); strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("observed %q, want %q", got, want)
			}
			for _, n := range c.stages {
				n.freed(t, OutcomeClosed)
			}
		})
	}
}

// A stage after stage 0 of a receipted session takes the end as a receipts frame with the
// receipts of exactly the stages before it, passes them on as they came with its own
// appended, and ends in order. A plain end frame there, a receipts frame with another
// count of receipts, one over MaxReceipt or one in a session that is not receipted is a
// violation by the previous hop: peer_lost, recorded, no receipt sent.
func TestReceiptedStageChecksTheEnd(t *testing.T) {
	const layers, width = 2, 8
	step0 := appendHiddenFrame(nil, 0, 1, promptStates(1, width))
	t.Run("good", func(t *testing.T) {
		n, sg := newSigningStage(t, newArith(layers, width, 1), nil)
		r := lastStageRaw(t, n, layers, width, 4, flagReceipts)
		if _, err := r.up.Write(step0); err != nil {
			t.Fatal(err)
		}
		if _, err := frame.ReadOne(r.ret, stepFrameMax(width, 4)); err != nil {
			t.Fatal(err)
		}
		earlier := "stage 0's receipt, opaque here"
		if err := frame.Write(r.up, encodeReceipts([]string{earlier})); err != nil {
			t.Fatal(err)
		}
		body, err := frame.ReadOne(r.ret, receiptsFrameMax(2))
		if err != nil {
			t.Fatal(err)
		}
		rs, err := decodeReceipts(body, 2)
		if err != nil || rs[0] != earlier || len(sg.signed()) != 1 || rs[1] != sg.signed()[0] {
			t.Fatalf("receipts %q (%v), want stage 0's then its own %q", rs, err, sg.signed())
		}
		if e := n.freed(t, OutcomeClosed); e.Steps != 1 || e.Positions != 1 || e.Session != fmt.Sprintf("%x", r.id) {
			t.Fatalf("session end %+v", e)
		}
	})
	tests := []struct {
		name      string
		receipted bool // the stage signs, so the session is receipted
		wire      []byte
	}{
		{"plain end", true, frame.Append(nil, []byte{frameEnd})},
		{"no receipt", true, frame.Append(nil, encodeReceipts(nil))},
		{"two receipts", true, frame.Append(nil, encodeReceipts([]string{"a", "b"}))},
		{"a receipt over MaxReceipt", true, frame.Append(nil, encodeReceipts([]string{strings.Repeat("x", MaxReceipt+1)}))},
		{"a receipt past the frame", true, frame.Append(nil, []byte{frameReceipts, 1, 5, 'a'})},
		{"bytes after the receipts", true, frame.Append(nil, append(encodeReceipts([]string{"a"}), 0))},
		{"receipts in a session without", false, frame.Append(nil, encodeReceipts([]string{"a"}))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seen observed
			var sign signWithSigner
			if !tt.receipted {
				sign = func(*signer) func(SessionEnd) (string, error) { return nil }
			}
			n, sg := newSigningStage(t, newArith(layers, width, 1), sign, WithServerObserver(&seen))
			var asked byte
			if tt.receipted {
				asked = flagReceipts
			}
			r := lastStageRaw(t, n, layers, width, 4, asked)
			if _, err := r.up.Write(step0); err != nil {
				t.Fatal(err)
			}
			if _, err := frame.ReadOne(r.ret, stepFrameMax(width, 4)); err != nil {
				t.Fatal(err)
			}
			r.violates(t, n, &seen, tt.wire)
			if len(sg.signed()) != 0 {
				t.Fatalf("signed %q for a session that did not end in order", sg.signed())
			}
		})
	}
}

// fakeReceiptedStage is a one-stage chain's stage that answers the open receipted, runs
// identity layers, and answers the head's end frame with end (whole frames, length
// included) on the return stream; with nothing, it ends the return stream.
func fakeReceiptedStage(t *testing.T, width int, end []byte) host.Host {
	t.Helper()
	return fakeHost(t, width, flagReceipts, 0, func(up, ret network.Stream) {
		r := frame.NewReader(up, 1<<20)
		for {
			body, err := r.Next()
			if err != nil {
				return
			}
			if body[0] == frameEnd {
				if len(end) == 0 {
					ret.Close()
					return
				}
				ret.Write(end)
				ret.Read(make([]byte, 1)) // until the head closes it
				return
			}
			step, n, h, err := decodeHidden(body, width, 16, nil)
			if err != nil {
				return
			}
			ret.Write(appendHiddenFrame(nil, step, n, h))
		}
	})
}

// A head believes the end of a receipted session only as the protocol allows it: a
// receipts frame with another count of receipts, one over its bound, or another frame
// where it is due leave the pipeline without receipts and are recorded against the last
// stage; a stream that ends, or an error frame, leave it without receipts, recorded
// against nobody. Close returns in each case.
func TestHeadChecksTheReceiptsFrame(t *testing.T) {
	const width, maxPositions = 8, 16
	tests := []struct {
		name  string
		end   []byte
		event string // "" for none
	}{
		{"no receipt", frame.Append(nil, encodeReceipts(nil)), reputation.ProtocolViolation.String()},
		{"two receipts", frame.Append(nil, encodeReceipts([]string{"a", "b"})), reputation.ProtocolViolation.String()},
		{"a receipt over MaxReceipt", frame.Append(nil, encodeReceipts([]string{strings.Repeat("x", MaxReceipt+1)})), reputation.ProtocolViolation.String()},
		{"over the bound", binary.AppendUvarint(nil, uint64(max(stepFrameMax(width, maxPositions), receiptsFrameMax(1), MaxErrorFrame)+1)), reputation.MalformedFrame.String()},
		{"a plain end frame", frame.Append(nil, []byte{frameEnd}), reputation.ProtocolViolation.String()},
		{"an output", appendHiddenFrame(nil, 1, 1, make([]float32, width)), reputation.ProtocolViolation.String()},
		{"nothing: the stream ends", nil, ""},
		{"an error", frame.Append(nil, encodeError(stageFault{stage: 0, code: inference.CodeShuttingDown})), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := fakeReceiptedStage(t, width, tt.end)
			head := newHost(t)
			know(head, fake)
			var seen observed
			var ck checker
			p, err := Open(t.Context(), head, arithModel, []Hop{{Peer: fake.ID(), Lo: 0, Hi: 4}}, maxPositions,
				WithReceipts(ck.check), WithPipelineObserver(&seen))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Forward(t.Context(), promptStates(2, width), 2); err != nil {
				t.Fatal(err)
			}
			p.Close()
			if rs := p.Receipts(); rs != nil || len(ck.asked()) != 0 {
				t.Fatalf("receipts %q, %d checked; want none", rs, len(ck.asked()))
			}
			var want []string
			if tt.event != "" {
				want = []string{fake.ID().String() + " " + tt.event}
			}
			if got := seen.events(); strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("observed %q, want %q", got, want)
			}
		})
	}
}
