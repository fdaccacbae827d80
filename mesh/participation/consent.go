package participation

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
	"unicode/utf8"

	"github.com/meshinfer/meshinfer/internal/atomicfile"
	"github.com/meshinfer/meshinfer/mesh/caps"
)

// ConsentVersion is the version of ConsentWording. Bump it whenever the wording changes what
// the owner agrees to: a record given to another version no longer counts.
const ConsentVersion = 1

// DefaultBatteryFloor is the battery floor the consent prompt offers (percent): the standard
// profile's floor, so an owner who accepts the default changes nothing.
const DefaultBatteryFloor = 30

// DefaultPauseOnMetered is the answer the consent prompt offers to pausing on metered
// connections: yes, a data plan is the owner's money.
const DefaultPauseOnMetered = true

// ConsentWording is what the interactive prompt shows before it asks, version ConsentVersion.
// Change it only together with ConsentVersion.
const ConsentWording = `meshinfer asks before it uses this machine. There are three separate choices:

  1. Run models locally: your own requests are answered by models on this machine.

  2. Contribute to the mesh: other people's requests run on this machine's processor,
     graphics card and memory. Their requests pass through this machine; it keeps only a
     receipt (time, requester, model, token counts, duration), never their text.

  3. Allow cloud fallback: when neither this machine nor the mesh can serve one of your
     requests, it is sent to the cloud API you configured. That provider sees the request
     and may charge for it.

Contributing pauses by itself, finishing the tasks already running and refusing new ones:
  - when the battery is below a floor you choose (default 30 %);
  - on a metered (cellular modem) connection, if you say so (default: yes, pause);
  - when the machine runs hot, or the profile set for this machine says to.

You can withdraw at any time, and it takes effect at once:
  meshinfer consent --withdraw
`

// Consent is the owner's recorded answer to the consent wording: ConsentWording, or the text
// the deployer configured in its place (WordingSHA256 tells which).
type Consent struct {
	// Version is the ConsentVersion of the wording the owner answered.
	Version int `json:"version"`
	// GivenAt is when the owner answered.
	GivenAt time.Time `json:"given_at"`
	// RunLocal allows serving the owner's own requests with local models.
	RunLocal bool `json:"run_local"`
	// Contribute allows serving other people's requests. Without it the node contributes
	// nothing: callers pass consented = have && Contribute to Breaches and Governor.Observe.
	Contribute bool `json:"contribute"`
	// CloudFallback allows sending the owner's requests to the configured cloud API.
	CloudFallback bool `json:"cloud_fallback"`
	// BatteryFloor is the owner's battery floor (percent, 0-100).
	BatteryFloor int `json:"battery_floor"`
	// PauseOnMetered pauses contributing on metered networks.
	PauseOnMetered bool `json:"pause_on_metered"`
	// RequireCharging pauses contributing while a battery is present and not charging.
	RequireCharging bool `json:"require_charging"`
	// ThermalMaxState is the owner's heat ceiling, a caps thermal state; "" (a record made
	// before the owner could set one) means none of the owner's: critical.
	ThermalMaxState string `json:"thermal_max_state,omitempty"`
	// MaxTasksPerMin is the owner's limit on the tasks admitted from peers a minute (0: none
	// of the owner's; at most MaxTasksPerMinLimit).
	MaxTasksPerMin int `json:"max_tasks_per_min"`
	// MaxBytesPerHour is the owner's cap on the mesh traffic of the tasks served for peers,
	// bytes an hour (0: none of the owner's; at most MaxBytesPerHourLimit).
	MaxBytesPerHour int64 `json:"max_bytes_per_hour"`
	// MaxMemoryShare is the owner's cap on the memory given to mesh work, in percent of the
	// memory available when the node starts (0: none of the owner's; at most 100). Absent
	// in records made before it could be set: none.
	MaxMemoryShare int `json:"max_memory_share,omitempty"`
	// WordingSHA256 is the SHA-256 (lower-case hex, WordingHash) of the wording the owner
	// was shown or, with the consent flags, answered to. "" is a record written before the
	// wording could be configured: it was given to ConsentWording, and counts as
	// DefaultWordingHash (WordingHash returns that).
	WordingSHA256 string `json:"wording_sha256,omitempty"`
}

// OwnerPolicy is the owner's part of the effective policy: everything the deployer's policy
// sets but Off (which is the deployer's choice; the owner's is not to contribute). A field
// the owner left at its loosest (no battery floor, charging not required, thermal
// critical or unset, no task limit, no traffic cap, no memory cap, no pause on metered)
// keeps the deployer's value under Stricter.
func (c Consent) OwnerPolicy() Policy {
	thermal := c.ThermalMaxState
	if thermal == "" {
		thermal = caps.ThermalCritical
	}
	return Policy{
		RequireCharging: c.RequireCharging,
		BatteryMinLevel: c.BatteryFloor,
		ThermalMaxState: thermal,
		MaxTasksPerMin:  c.MaxTasksPerMin,
		PauseOnMetered:  c.PauseOnMetered,
		MaxBytesPerHour: c.MaxBytesPerHour,
		MaxMemoryShare:  c.MaxMemoryShare,
	}
}

// WordingHash is the hash of the wording c was given to: WordingSHA256, or for a record
// without one DefaultWordingHash (see Consent.WordingSHA256).
func (c Consent) WordingHash() string {
	if c.WordingSHA256 == "" {
		return DefaultWordingHash()
	}
	return c.WordingSHA256
}

// GivenFor reports whether c was given to the wording whose WordingHash is hash. A node
// whose wording is another treats the owner's consent as not given.
func (c Consent) GivenFor(hash string) bool { return c.WordingHash() == hash }

// WordingHash is the SHA-256 of a consent wording's bytes, in lower-case hex: what a
// Consent's WordingSHA256 records. The bytes are hashed as they are, so any change to the
// text, a line break included, asks the owner again.
func WordingHash(wording string) string {
	sum := sha256.Sum256([]byte(wording))
	return hex.EncodeToString(sum[:])
}

// DefaultWordingHash is WordingHash(ConsentWording): the hash of the built-in wording.
func DefaultWordingHash() string { return WordingHash(ConsentWording) }

// validate checks a record for SaveConsent and LoadConsent.
func (c Consent) validate() error {
	if c.Version != ConsentVersion {
		return fmt.Errorf("consent version %d, this build asks with version %d", c.Version, ConsentVersion)
	}
	if c.GivenAt.IsZero() {
		return errors.New("given_at is missing")
	}
	if c.BatteryFloor < 0 || c.BatteryFloor > 100 {
		return fmt.Errorf("battery_floor %d out of range 0 to 100", c.BatteryFloor)
	}
	if c.ThermalMaxState != "" {
		if _, ok := thermalRank(c.ThermalMaxState); !ok {
			return fmt.Errorf("thermal_max_state %q unknown: use %s, %s, %s or %s", c.ThermalMaxState,
				caps.ThermalNominal, caps.ThermalFair, caps.ThermalSerious, caps.ThermalCritical)
		}
	}
	if c.MaxTasksPerMin < 0 || c.MaxTasksPerMin > MaxTasksPerMinLimit {
		return fmt.Errorf("max_tasks_per_min %d out of range 0 (no limit) to %d", c.MaxTasksPerMin, MaxTasksPerMinLimit)
	}
	if c.MaxBytesPerHour < 0 || c.MaxBytesPerHour > MaxBytesPerHourLimit {
		return fmt.Errorf("max_bytes_per_hour %d out of range 0 (no cap) to %d", c.MaxBytesPerHour, MaxBytesPerHourLimit)
	}
	if c.MaxMemoryShare < 0 || c.MaxMemoryShare > 100 {
		return fmt.Errorf("max_memory_share %d out of range 0 (no cap) to 100 (percent)", c.MaxMemoryShare)
	}
	if c.WordingSHA256 != "" && !isSHA256Hex(c.WordingSHA256) {
		return fmt.Errorf("wording_sha256 %q is not a SHA-256 in lower-case hex (64 characters)", c.WordingSHA256)
	}
	return nil
}

// isSHA256Hex reports whether s is 64 lower-case hex digits.
func isSHA256Hex(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for _, r := range s {
		if !('0' <= r && r <= '9' || 'a' <= r && r <= 'f') {
			return false
		}
	}
	return true
}

// MaxConsentWording bounds a deployer's consent wording (bytes, 64 KiB): a wording is a page
// or two of plain text, and the bound keeps a wrong path (a log, a disk image) from being
// read whole and printed.
const MaxConsentWording = 64 << 10

// LoadConsentWording reads the deployer's consent wording from path (--consent-text): the
// text the prompt shows in place of ConsentWording, whose WordingHash the consent record
// keeps. It must be UTF-8 text, not blank, with no NUL byte, and at most MaxConsentWording
// bytes; anything else is an error naming the file.
func LoadConsentWording(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("read consent text: %w; check the path", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConsentWording+1))
	if err != nil {
		return "", fmt.Errorf("read consent text %s: %w", path, err)
	}
	switch {
	case len(data) > MaxConsentWording:
		return "", fmt.Errorf("consent text %s is larger than %d KiB: the file holds the plain text the owner is asked to agree to", path, MaxConsentWording>>10)
	case len(bytes.TrimSpace(data)) == 0:
		return "", fmt.Errorf("consent text %s is empty: write the text the owner is asked to agree to", path)
	case !utf8.Valid(data) || bytes.IndexByte(data, 0) >= 0:
		return "", fmt.Errorf("consent text %s is not UTF-8 text", path)
	}
	return string(data), nil
}

// ConsentFile is the name of the consent record inside the data dir: the JSON of Consent,
// file mode 0600.
const ConsentFile = "consent.json"

// maxConsentFile bounds how much of the consent file is read (bytes): a record is about 200
// bytes.
const maxConsentFile = 64 << 10

// LoadConsent reads the owner's consent from dir. ok is false, with no error, when none is
// recorded. A record given to another wording version, or one that cannot be read or parsed,
// is an error that says to run `meshinfer consent` again: the owner has not agreed to what
// this build would do.
func LoadConsent(dir string) (c Consent, ok bool, err error) {
	path := filepath.Join(dir, ConsentFile)
	f, err := atomicfile.OpenPrivate(path, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return Consent{}, false, nil
	}
	if err != nil {
		return Consent{}, false, fmt.Errorf("read consent: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConsentFile+1))
	if err != nil {
		return Consent{}, false, fmt.Errorf("read consent %s: %w", path, err)
	}
	if len(data) > maxConsentFile {
		return Consent{}, false, fmt.Errorf("consent record %s is larger than %d KiB, so it is not a consent record; run 'meshinfer consent' to record consent again",
			path, maxConsentFile>>10)
	}
	c, err = decodeConsent(data)
	if err != nil {
		return Consent{}, false, fmt.Errorf("consent record %s: %w; run 'meshinfer consent' to answer again", path, err)
	}
	return c, true, nil
}

// decodeConsent parses a consent record: the version first, so a record of another version
// is reported as such rather than as an unknown field, then the whole record strictly.
func decodeConsent(data []byte) (Consent, error) {
	// json.Unmarshal rejects anything after the record.
	var head struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return Consent{}, fmt.Errorf("malformed (%w)", err)
	}
	if head.Version == nil {
		return Consent{}, errors.New("malformed (no version)")
	}
	if *head.Version != ConsentVersion {
		return Consent{}, fmt.Errorf("given to wording version %d, this build asks with version %d", *head.Version, ConsentVersion)
	}
	var c Consent
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Consent{}, fmt.Errorf("malformed (%w)", err)
	}
	if err := c.validate(); err != nil {
		return Consent{}, fmt.Errorf("malformed (%w)", err)
	}
	return c, nil
}

// SaveConsent records c in dir, creating dir (mode 0700) if needed. The record is written to
// a temporary file (mode 0600), synced and renamed over ConsentFile, so a crash leaves the old
// record or the new one, never a torn one. c.Version must be ConsentVersion.
func SaveConsent(dir string, c Consent) error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("save consent: %w", err)
	}
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("save consent: %w", err)
	}
	data = append(data, '\n')
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("save consent: create data dir: %w", err)
	}
	if _, err := atomicfile.WriteFile(filepath.Join(dir, ConsentFile), data); err != nil {
		return fmt.Errorf("save consent: %w", err)
	}
	return nil
}

// WithdrawConsent removes the consent record from dir. Withdrawing when nothing is recorded
// is not an error. The node stops contributing at its next observation (Breaches reports
// no_consent); the caller that withdraws should make it observe at once.
func WithdrawConsent(dir string) error {
	err := os.Remove(filepath.Join(dir, ConsentFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("withdraw consent: %w", err)
	}
	if err := atomicfile.SyncDir(dir); err != nil {
		return fmt.Errorf("withdraw consent: %w", err)
	}
	return nil
}
