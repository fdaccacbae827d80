package caps

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Domain separates capability signatures from every other use of a node's identity key: a
// signature made for another purpose (a libp2p record, a receipt, a caps/1 vector) never
// verifies as a vector.
const Domain = "meshinfer/capability-vector/v2\n"

// sigPrefix names the signature scheme inside the sig field.
const sigPrefix = "ed25519:"

// Errors returned by Decode and Verify. Callers act on them: a bad signature or malformed
// vector is the sender's fault (reject and penalize); expiry and skew are not (ignore).
var (
	ErrTooLarge     = errors.New("capability vector too large")
	ErrMalformed    = errors.New("capability vector malformed")
	ErrBadSignature = errors.New("capability signature invalid")
	ErrExpired      = errors.New("capability vector expired")
	ErrClockSkew    = errors.New("capability vector issued in the future (clock_skew)")
	// ErrOldShape comes with ErrMalformed or ErrOutOfBounds when the refused vector has the
	// shape of caps/1 (see oldShapeMarks): its sender runs an older meshinfer.
	ErrOldShape = errors.New("capability vector in the old caps/1 shape")
)

// Canonical returns the bytes a signature covers: Domain followed by the JSON encoding of v
// with sig left out.
func Canonical(v *Vector) ([]byte, error) {
	c := *v
	c.Sig = ""
	body, err := json.Marshal(&c)
	if err != nil {
		return nil, fmt.Errorf("encode capability vector: %w", err)
	}
	return append([]byte(Domain), body...), nil
}

// Sign sets v.PeerID from key and v.Sig to a signature over the canonical encoding. The key
// must be ed25519: other key types cannot be checked by receivers from the peer ID alone.
func Sign(key crypto.PrivKey, v *Vector) error {
	if key.Type() != crypto.Ed25519 {
		return fmt.Errorf("sign capability vector: key type %v is not ed25519", key.Type())
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return fmt.Errorf("sign capability vector: %w", err)
	}
	v.PeerID = id.String()
	msg, err := Canonical(v)
	if err != nil {
		return err
	}
	sig, err := key.Sign(msg)
	if err != nil {
		return fmt.Errorf("sign capability vector: %w", err)
	}
	v.Sig = sigPrefix + base64.StdEncoding.EncodeToString(sig)
	return nil
}

// Encode returns the wire form of a signed vector.
func Encode(v *Vector) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode capability vector: %w", err)
	}
	if len(b) > MaxEncodedSize {
		return nil, fmt.Errorf("%w: %d bytes, max %d", ErrTooLarge, len(b), MaxEncodedSize)
	}
	return b, nil
}

// Decode parses a wire vector strictly: at most MaxEncodedSize bytes, one JSON object, no
// unknown fields, values within bounds. It does not check the signature. A refused vector in
// the caps/1 shape gets an error that also wraps ErrOldShape and names what gave it away.
func Decode(data []byte) (*Vector, error) {
	if len(data) > MaxEncodedSize {
		return nil, fmt.Errorf("%w: %d bytes, max %d", ErrTooLarge, len(data), MaxEncodedSize)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var v Vector
	if err := dec.Decode(&v); err != nil {
		return nil, oldShape(data, fmt.Errorf("%w: %w", ErrMalformed, err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: trailing data after the object", ErrMalformed)
	}
	if err := v.Validate(); err != nil {
		return nil, oldShape(data, err)
	}
	// The wire form may be more compact than our encoding of it (encoding/json escapes <, >,
	// & and U+2028 as six bytes each), and everything accepted must be re-encodable: a
	// stored vector is served on the console and may be relayed.
	if enc, err := json.Marshal(&v); err != nil || len(enc) > MaxEncodedSize {
		return nil, fmt.Errorf("%w: re-encoded form exceeds %d bytes", ErrTooLarge, MaxEncodedSize)
	}
	return &v, nil
}

// Verify decodes data and accepts it only when the signature verifies with the ed25519 key
// inside peer_id and the vector is current at now, allowing MaxClockSkew between the
// signer's clock and ours in either direction: it is refused as expired once expires_at +
// MaxClockSkew has passed, and as clock_skew when issued_at lies more than MaxClockSkew ahead.
// A signer whose clock is behind by more than MaxClockSkew looks exactly like a replay of an
// old record, and is refused as expired.
func Verify(data []byte, now time.Time) (*Vector, error) {
	v, err := Decode(data)
	if err != nil {
		return nil, err
	}
	if err := checkSignature(v); err != nil {
		return nil, err
	}
	nowMS := now.UnixMilli()
	if v.Expires+MaxClockSkew.Milliseconds() <= nowMS {
		return nil, fmt.Errorf("%w: expired %d ms ago", ErrExpired, nowMS-v.Expires)
	}
	if v.IssuedAt > nowMS+MaxClockSkew.Milliseconds() {
		return nil, fmt.Errorf("%w: issued %d ms ahead", ErrClockSkew, v.IssuedAt-nowMS)
	}
	return v, nil
}

func checkSignature(v *Vector) error {
	id, err := peer.Decode(v.PeerID)
	if err != nil {
		return fmt.Errorf("%w: peer_id: %w", ErrBadSignature, err)
	}
	pub, err := id.ExtractPublicKey()
	if err != nil {
		return fmt.Errorf("%w: peer_id carries no public key: %w", ErrBadSignature, err)
	}
	if pub.Type() != crypto.Ed25519 {
		return fmt.Errorf("%w: key type %v is not ed25519", ErrBadSignature, pub.Type())
	}
	enc, ok := strings.CutPrefix(v.Sig, sigPrefix)
	if !ok {
		return fmt.Errorf("%w: sig lacks %q prefix", ErrBadSignature, sigPrefix)
	}
	sig, err := base64.StdEncoding.Strict().DecodeString(enc)
	if err != nil || len(sig) != 64 {
		return fmt.Errorf("%w: sig is not 64 bytes of base64", ErrBadSignature)
	}
	msg, err := Canonical(v)
	if err != nil {
		return err
	}
	ok, err = pub.Verify(msg, sig)
	if err != nil || !ok {
		return fmt.Errorf("%w: does not verify for %s", ErrBadSignature, v.PeerID)
	}
	return nil
}
