package frame

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	bodies := [][]byte{{}, []byte("a"), bytes.Repeat([]byte("x"), 300), bytes.Repeat([]byte("y"), 1024)}
	for _, b := range bodies {
		if err := Write(&buf, b); err != nil {
			t.Fatal(err)
		}
	}
	r := NewReader(&buf, 1024)
	for i, want := range bodies {
		got, err := r.Next()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("frame %d: got %d bytes, %v; want %d bytes", i, len(got), err, len(want))
		}
	}
	if _, err := r.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

// countingReader counts the bytes a reader takes from it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestRefusals(t *testing.T) {
	big := Append(nil, bytes.Repeat([]byte("z"), 1025))
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"over the maximum by one", big, ErrTooLarge},
		{"huge length", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, ErrTooLarge},
		{"non-minimal varint", []byte{0x81, 0x00, 'a'}, ErrMalformed},
		{"varint overflow", bytes.Repeat([]byte{0xff}, 11), ErrMalformed},
		{"truncated body", []byte{0x05, 'a', 'b'}, io.ErrUnexpectedEOF},
		{"truncated length", []byte{0x80}, io.ErrUnexpectedEOF},
	}
	var most int64 // bytes read to refuse an over-length frame
	for _, tc := range cases {
		cr := &countingReader{r: bytes.NewReader(tc.in)}
		_, err := NewReader(cr, 1024).Next()
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
		// bufio reads ahead up to its buffer, but never more than what the peer sent; what
		// matters is that nothing beyond the limit is allocated or waited for.
		if tc.want == ErrTooLarge && cr.n > 1024+16 {
			t.Errorf("%s: read %d bytes to refuse", tc.name, cr.n)
		}
		if tc.want == ErrTooLarge {
			most = max(most, int64(cr.n))
		}
	}
	t.Logf("figure F9: %d malformed frames refused with their error; an over-length frame after reading at most %d bytes (maximum 1024)", len(cases), most)
}

func FuzzReader(f *testing.F) {
	f.Add(Append(nil, []byte("hello")))
	f.Add([]byte{0x81, 0x00})
	f.Add(bytes.Repeat([]byte{0xff}, 12))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := NewReader(bytes.NewReader(in), 256)
		for range 64 {
			b, err := r.Next()
			if err != nil {
				return
			}
			if len(b) > 256 {
				t.Fatalf("frame of %d bytes over the maximum", len(b))
			}
			// What was read re-encodes to the same bytes.
			if enc := Append(nil, b); !bytes.Contains(in, enc) {
				t.Fatalf("frame does not re-encode to its input")
			}
		}
	})
}

// ReadOne reads exactly one frame and leaves what follows unread; it enforces the same
// bounds as a Reader.
func TestReadOne(t *testing.T) {
	var buf bytes.Buffer
	Write(&buf, []byte("first"))
	buf.WriteString("rest")
	got, err := ReadOne(&buf, 16)
	if err != nil || string(got) != "first" || buf.String() != "rest" {
		t.Fatalf("ReadOne = %q, %v; left %q", got, err, buf.String())
	}
	var big bytes.Buffer
	Write(&big, make([]byte, 100))
	if _, err := ReadOne(&big, 10); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized: %v", err)
	}
	if _, err := ReadOne(bytes.NewReader(nil), 10); !errors.Is(err, io.EOF) {
		t.Fatalf("empty: %v", err)
	}
	if _, err := ReadOne(bytes.NewReader([]byte{5, 'a'}), 10); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated: %v", err)
	}
}

// The length prefix is go-varint's: minimal, at most 9 bytes.
func TestLengthPrefix(t *testing.T) {
	cases := []struct {
		in   []byte
		want uint64
		err  error
	}{
		{[]byte{0x00}, 0, nil},
		{[]byte{0x7f}, 127, nil},
		{[]byte{0x80, 0x01}, 128, nil},
		{[]byte{0xff, 0x7f}, 16383, nil},
		{[]byte{0x80, 0x80, 0x01}, 16384, nil},
		{[]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, 1<<63 - 1, nil},
		{[]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x80}, 0, ErrMalformed},
		{[]byte{0x80, 0x00}, 0, ErrMalformed},
		{[]byte{0x80, 0x80}, 0, io.ErrUnexpectedEOF},
		{[]byte{}, 0, io.EOF},
	}
	for _, tc := range cases {
		got, err := readUvarint(bytes.NewReader(tc.in))
		if got != tc.want || !errors.Is(err, tc.err) {
			t.Errorf("% x: %d, %v; want %d, %v", tc.in, got, err, tc.want, tc.err)
		}
		if tc.err == nil && tc.want < 1<<20 {
			if enc := Append(nil, make([]byte, tc.want)); !bytes.Equal(enc[:len(tc.in)], tc.in) {
				t.Errorf("Append of %d bytes starts % x, want % x", tc.want, enc[:len(tc.in)], tc.in)
			}
		}
	}
}

// A frame announcing the maximum but ending after a few bytes costs its reader about what
// arrived, not the announced length (issue 19, finding 1: 1,500 WebRTC channels announcing
// 256 KiB each took a node from 26 to 719 MB).
func TestShortFrameHoldsWhatArrived(t *testing.T) {
	const announced = 8 << 20
	in := append(binary.AppendUvarint(nil, announced), make([]byte, 10)...) // the length, then 10 bytes
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ReadOne(bytes.NewReader(in), announced)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short frame: %v, want io.ErrUnexpectedEOF", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<10 {
		t.Fatalf("reading 10 bytes of an announced %d allocated %d bytes", announced, grew)
	}
}
