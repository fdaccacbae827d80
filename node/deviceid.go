package node

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/meshinfer/meshinfer/internal/atomicfile"
	"github.com/meshinfer/meshinfer/mesh/probe"
)

// DeviceFile is the name of the device id's record inside the data dir, mode 0600:
//
//	{
//	  "version": 1,
//	  "salt": "<64 hex digits: 32 random bytes>",
//	  "id": "dev_<32 hex digits>"
//	}
//
// The salt is made once, on first use, and never leaves the machine; id is the device id
// last derived from it, kept so that a change can be told.
const DeviceFile = "device.json"

// DeviceIDPrefix starts every derived device id; DeviceIDLen is the length of one: the
// prefix and 32 lower-case hex digits (16 bytes).
const (
	DeviceIDPrefix = "dev_"
	DeviceIDLen    = len(DeviceIDPrefix) + 2*deviceIDBytes
)

const (
	deviceIDBytes   = 16 // of the HMAC, kept in the id
	deviceSaltBytes = 32
	deviceVersion   = 1
	maxDeviceFile   = 4 << 10 // a record is about 150 bytes
)

// Device is this machine's device id, as LoadOrCreateDevice found it.
type Device struct {
	ID      string
	Created bool // the record was made now: first use of the data dir
	// Previous is the id the record held when it differs from ID: the machine's facts
	// changed since (a new GPU, more memory) or the data dir was copied from another
	// machine. "" otherwise.
	Previous string
}

// deviceRecord is DeviceFile's content.
type deviceRecord struct {
	Version int    `json:"version"`
	Salt    string `json:"salt"`
	ID      string `json:"id"`
}

// deriveDeviceID is the device id of a machine with facts f and a data dir with salt:
// DeviceIDPrefix and the first 16 bytes of HMAC-SHA-256(salt, f.Canonical()) in hex. Without
// the salt, which stays in the data dir, the id cannot be tied to the facts: a guess of them
// cannot be checked against it.
func deriveDeviceID(salt []byte, f probe.DeviceFacts) string {
	mac := hmac.New(sha256.New, salt)
	mac.Write([]byte("meshinfer device id v1\n"))
	mac.Write(f.Canonical())
	return DeviceIDPrefix + hex.EncodeToString(mac.Sum(nil)[:deviceIDBytes])
}

// ValidDeviceID reports whether s has the form of a derived device id: DeviceIDPrefix and 32
// lower-case hex digits.
func ValidDeviceID(s string) bool {
	hexPart, ok := strings.CutPrefix(s, DeviceIDPrefix)
	return ok && len(s) == DeviceIDLen && isLowerHex(hexPart)
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// LoadOrCreateDevice returns the device id of this machine, whose facts are f
// (probe.ReadDeviceFacts), for the data dir dataDir: the id derived from f and the salt of
// dataDir's DeviceFile. On first use it makes the salt (32 random bytes) and writes the file,
// creating the dir (0700); the file is 0600, written whole through internal/atomicfile.
//
// The id is derived afresh on every call, so it is the same for as long as the facts are:
// across restarts, and whatever order the probe lists GPUs in. When the facts change (a GPU
// added or removed, another CPU, memory past the next power of two), or the data dir was
// copied to another machine, the id changes: the record is rewritten with the new id and the
// same salt, and Device.Previous names the old one. Two data dirs have two salts, so two ids
// even on one machine.
//
// A record that cannot be read, is not this user's own regular file, can be read by group
// or others, or does not parse is an error that says how to fix it; it is never replaced.
// Two processes making the record at the same moment each write one: the last write stays,
// and the other's first id is not used again.
func LoadOrCreateDevice(dataDir string, f probe.DeviceFacts) (Device, error) {
	path := filepath.Join(dataDir, DeviceFile)
	rec, err := loadDevice(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		salt := make([]byte, deviceSaltBytes)
		if _, err := rand.Read(salt); err != nil {
			return Device{}, fmt.Errorf("make the device salt: %w", err)
		}
		id := deriveDeviceID(salt, f)
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			return Device{}, fmt.Errorf("create data dir: %w", err)
		}
		if err := saveDevice(path, salt, id); err != nil {
			return Device{}, err
		}
		return Device{ID: id, Created: true}, nil
	case err != nil:
		return Device{}, err
	}
	salt, _ := hex.DecodeString(rec.Salt) // checked by loadDevice
	id := deriveDeviceID(salt, f)
	if id == rec.ID {
		return Device{ID: id}, nil
	}
	if err := saveDevice(path, salt, id); err != nil {
		return Device{}, err
	}
	return Device{ID: id, Previous: rec.ID}, nil
}

func saveDevice(path string, salt []byte, id string) error {
	data, err := json.MarshalIndent(deviceRecord{Version: deviceVersion, Salt: hex.EncodeToString(salt), ID: id}, "", "  ")
	if err != nil {
		return fmt.Errorf("save device id: %w", err)
	}
	if _, err := atomicfile.WriteFile(path, append(data, '\n')); err != nil {
		return fmt.Errorf("save device id: %w", err)
	}
	return nil
}

// loadDevice reads and checks the record at path. A missing file gives an error that
// matches fs.ErrNotExist.
func loadDevice(path string) (deviceRecord, error) {
	const fix = "move it away to make a new device id (a coordinator then sees a new device)"
	f, err := atomicfile.OpenPrivate(path, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return deviceRecord{}, err
	}
	if err != nil {
		return deviceRecord{}, fmt.Errorf("read device id: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return deviceRecord{}, fmt.Errorf("read device id: %w", err)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return deviceRecord{}, fmt.Errorf("device id record %s has mode %04o: others could read its salt; run 'chmod 600 %s'", path, perm, path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxDeviceFile+1))
	if err != nil {
		return deviceRecord{}, fmt.Errorf("read device id %s: %w", path, err)
	}
	if len(data) > maxDeviceFile {
		return deviceRecord{}, fmt.Errorf("device id record %s is over %d KiB, so not a record; %s", path, maxDeviceFile>>10, fix)
	}
	var rec deviceRecord
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err = dec.Decode(&rec)
	if err == nil && len(bytes.TrimSpace(data[dec.InputOffset():])) > 0 {
		err = errors.New("data after the record")
	}
	salt, herr := hex.DecodeString(rec.Salt)
	switch {
	case err != nil:
		return deviceRecord{}, fmt.Errorf("device id record %s is malformed (%w); %s", path, err, fix)
	case rec.Version != deviceVersion:
		return deviceRecord{}, fmt.Errorf("device id record %s has version %d, this build reads version %d; %s", path, rec.Version, deviceVersion, fix)
	case herr != nil || len(salt) != deviceSaltBytes || !isLowerHex(rec.Salt):
		return deviceRecord{}, fmt.Errorf("device id record %s: salt is not %d lower-case hex digits; %s", path, 2*deviceSaltBytes, fix)
	case !ValidDeviceID(rec.ID):
		return deviceRecord{}, fmt.Errorf("device id record %s: id is not %s and %d lower-case hex digits; %s", path, DeviceIDPrefix, 2*deviceIDBytes, fix)
	}
	return rec, nil
}
