// Package frame reads and writes the length-prefixed frames every meshinfer stream protocol
// uses: an unsigned varint (minimal encoding) giving the body length, then the body.
//
// The reader enforces a hard maximum before it reads a body, so a peer announcing a huge
// frame costs at most the varint's bytes (≤ 10) to refuse; it also refuses non-minimal
// varints, which would let one length have many encodings.
package frame

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"github.com/multiformats/go-varint"
)

// binaryMaxVarintLen is the longest varint of a 64-bit length.
const binaryMaxVarintLen = 10

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
	n, err := varint.ReadUvarint(lr)
	switch {
	case errors.Is(err, io.EOF):
		return nil, io.EOF
	case errors.Is(err, varint.ErrNotMinimal), errors.Is(err, varint.ErrOverflow):
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	case err != nil:
		return nil, err
	}
	if n > uint64(max) {
		return nil, fmt.Errorf("%w: %d bytes, max %d", ErrTooLarge, n, max)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}

// Append appends body as one frame to dst and returns the extended slice.
func Append(dst, body []byte) []byte {
	var lenBuf [binaryMaxVarintLen]byte
	n := varint.PutUvarint(lenBuf[:], uint64(len(body)))
	dst = append(dst, lenBuf[:n]...)
	return append(dst, body...)
}

// Write writes body as one frame to w.
func Write(w io.Writer, body []byte) error {
	_, err := w.Write(Append(make([]byte, 0, binaryMaxVarintLen+len(body)), body))
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
