// Package frame reads and writes the length-prefixed frames every meshinfer stream protocol
// uses (transport's and mesh's alike): an unsigned varint (minimal encoding, at most 9 bytes,
// so a length below 2^63) giving the body length, then the body.
//
// Its one job is that framing, and its invariants are the reader's: a hard maximum is
// enforced before a body is read, so a peer announcing a huge frame costs at most the
// varint's bytes (≤ 9) to refuse; a body's buffer grows with the bytes that arrive, never
// allocated from the announced length; a non-minimal varint, which would let one length have many
// encodings, is refused; a stream that ends inside a frame is io.ErrUnexpectedEOF, never a
// short frame.
//
// Like every package under internal/, it imports nothing of the project, only the standard
// library (testnet/deps_test.go enforces it). The varint is the one of
// github.com/multiformats/go-varint, which libp2p protocols use, written here on
// encoding/binary.
package frame

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// maxVarintLen is the longest length prefix read: 9 bytes, lengths below 2^63 (go-varint's
// MaxLenUvarint63). Append writes at most binary.MaxVarintLen64 bytes.
const maxVarintLen = 9

// ErrTooLarge is returned for a frame whose announced length exceeds the reader's maximum.
var ErrTooLarge = errors.New("frame too large")

// ErrMalformed is returned for a length prefix that is not a minimal unsigned varint.
var ErrMalformed = errors.New("malformed frame length")

// Reader reads frames of at most Max bytes.
type Reader struct {
	r   *bufio.Reader
	max int
}

// NewReader reads frames from r, refusing any longer than max bytes.
func NewReader(r io.Reader, max int) *Reader {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReader(r)
	}
	return &Reader{r: br, max: max}
}

// Next returns the next frame's body. At a clean end of stream (no byte of a new frame
// read) it returns io.EOF; a stream that ends inside a frame gives io.ErrUnexpectedEOF.
// The returned slice is owned by the caller.
func (fr *Reader) Next() ([]byte, error) { return read(fr.r, fr.r, fr.max) }

// read reads one frame of at most max bytes: its length from lr, then its body from r (the
// same stream).
func read(lr io.ByteReader, r io.Reader, max int) ([]byte, error) {
	n, err := readUvarint(lr)
	if err != nil {
		return nil, err
	}
	if n > uint64(max) {
		return nil, fmt.Errorf("%w: %d bytes, max %d", ErrTooLarge, n, max)
	}
	// The body is held as it arrives, never allocated from the announced length: a peer that
	// announces max bytes and sends few makes this side hold what it sent, not max.
	buf := make([]byte, 0, min(int(n), readChunk))
	for len(buf) < int(n) {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(int(n)-len(buf), cap(buf))) // doubles, up to n
		}
		m, err := r.Read(buf[len(buf):min(int(n), cap(buf))])
		buf = buf[:len(buf)+m]
		if err != nil && len(buf) < int(n) {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return buf, nil
}

// readChunk is the most a frame's buffer holds before its bytes arrive (4 KiB); it doubles
// as they do.
const readChunk = 4 << 10

// readUvarint reads a length prefix: io.EOF before its first byte, io.ErrUnexpectedEOF
// inside it, ErrMalformed for a non-minimal encoding or one longer than maxVarintLen.
func readUvarint(r io.ByteReader) (uint64, error) {
	var x uint64
	for i := 0; ; i++ {
		b, err := r.ReadByte()
		if err != nil {
			if errors.Is(err, io.EOF) && i > 0 {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		if i == maxVarintLen-1 && b >= 0x80 {
			return 0, fmt.Errorf("%w: longer than %d bytes", ErrMalformed, maxVarintLen)
		}
		if b < 0x80 {
			if b == 0 && i > 0 {
				return 0, fmt.Errorf("%w: not minimally encoded", ErrMalformed)
			}
			return x | uint64(b)<<(7*i), nil
		}
		x |= uint64(b&0x7f) << (7 * i)
	}
}

// Append appends body as one frame to dst and returns the extended slice.
func Append(dst, body []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(body)))
	return append(dst, body...)
}

// UvarintLen is the length of x as an unsigned varint: what binary.AppendUvarint appends.
// Writers of frames they build in place (a length prefix, then the body) size the prefix
// with it.
func UvarintLen(x uint64) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}

// Write writes body as one frame to w.
func Write(w io.Writer, body []byte) error {
	_, err := w.Write(Append(make([]byte, 0, binary.MaxVarintLen64+len(body)), body))
	return err
}

// ReadOne reads one frame of at most max bytes from r without reading past it: the length
// one byte at a time, then exactly the body. Use it where the bytes after the frame belong
// to another reader (a Reader buffers ahead). Errors are Reader.Next's.
func ReadOne(r io.Reader, max int) ([]byte, error) { return read(byteReader{r}, r, max) }

// byteReader reads single bytes from r, unbuffered.
type byteReader struct{ r io.Reader }

func (b byteReader) ReadByte() (byte, error) {
	var c [1]byte
	_, err := io.ReadFull(b.r, c[:])
	return c[0], err
}
