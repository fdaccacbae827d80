package participation

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Overrides are the deployer's per-field changes to a profile, read from a config file. A nil
// field keeps the profile's value; a set field replaces it, looser or stricter.
type Overrides struct {
	// Profile names the profile when --profile is not given (empty: DefaultProfile).
	Profile string `json:"profile,omitempty"`
	// RequireCharging replaces Policy.RequireCharging.
	RequireCharging *bool `json:"require_charging,omitempty"`
	// BatteryMinLevel replaces Policy.BatteryMinLevel (percent, 0-100).
	BatteryMinLevel *int `json:"battery_min_level,omitempty"`
	// ThermalMaxState replaces Policy.ThermalMaxState (a caps thermal state).
	ThermalMaxState *string `json:"thermal_max_state,omitempty"`
	// MaxTasksPerMin replaces Policy.MaxTasksPerMin (0: no limit).
	MaxTasksPerMin *int `json:"max_tasks_per_min,omitempty"`
	// PauseOnMetered replaces Policy.PauseOnMetered.
	PauseOnMetered *bool `json:"pause_on_metered,omitempty"`
	// MaxBytesPerHour replaces Policy.MaxBytesPerHour (bytes; 0: no cap).
	MaxBytesPerHour *int64 `json:"max_bytes_per_hour,omitempty"`
	// MaxMemoryShare replaces Policy.MaxMemoryShare (percent, 0-100; 0: no cap).
	MaxMemoryShare *int `json:"max_memory_share,omitempty"`
}

// maxOverridesFile bounds how much of an overrides file is read (bytes): the largest sensible
// file is a few hundred bytes, and the bound keeps a wrong path (a log, a disk image) from
// being read whole.
const maxOverridesFile = 64 << 10

// overrideFields lists the keys an overrides file may hold, for error messages.
const overrideFields = "profile, require_charging, battery_min_level, thermal_max_state, max_tasks_per_min, pause_on_metered, max_bytes_per_hour, max_memory_share"

// overrideField reports whether k is a key an overrides file may hold, spelled exactly
// (encoding/json alone would also accept "Profile" or "PROFILE").
func overrideField(k string) bool {
	switch k {
	case "profile", "require_charging", "battery_min_level", "thermal_max_state",
		"max_tasks_per_min", "pause_on_metered", "max_bytes_per_hour", "max_memory_share":
		return true
	}
	return false
}

// LoadOverrides reads the deployer's overrides file: one JSON object with the fields of
// Overrides, at most 64 KiB. Unknown fields, values of the wrong type or out of range, and
// anything after the object are errors that name the file and the field and say what to
// write instead. A missing file is an error too (it wraps fs.ErrNotExist): the deployer named
// it. A field set to null counts as absent.
func LoadOverrides(path string) (Overrides, error) {
	f, err := os.Open(path)
	if err != nil {
		return Overrides{}, fmt.Errorf("read participation overrides: %w; check the path", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxOverridesFile+1))
	if err != nil {
		return Overrides{}, fmt.Errorf("read participation overrides %s: %w", path, err)
	}
	if len(data) > maxOverridesFile {
		return Overrides{}, fmt.Errorf("participation overrides %s: larger than %d KiB; the file holds one small JSON object such as {\"profile\": \"eco\"}",
			path, maxOverridesFile>>10)
	}
	o, err := decodeOverrides(data)
	if err != nil {
		return Overrides{}, fmt.Errorf("participation overrides %s: %w", path, err)
	}
	return o, nil
}

// decodeOverrides parses and checks one overrides object.
func decodeOverrides(data []byte) (Overrides, error) {
	example := `write one JSON object such as {"profile": "eco", "battery_min_level": 40}`
	if len(bytes.TrimSpace(data)) == 0 {
		return Overrides{}, fmt.Errorf("empty file: %s", example)
	}
	// First pass: the keys, matched exactly. json.Unmarshal also rejects anything after the
	// object.
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		return Overrides{}, jsonError(err, example)
	}
	if keys == nil {
		return Overrides{}, fmt.Errorf("null is not an object: %s", example)
	}
	var unknown []string
	for k := range keys {
		if !overrideField(k) {
			unknown = append(unknown, strconv.Quote(k))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown) // one message for the same file every time
		noun := "field"
		if len(unknown) > 1 {
			noun = "fields"
		}
		return Overrides{}, fmt.Errorf("unknown %s %s: the fields are %s", noun, strings.Join(unknown, ", "), overrideFields)
	}
	// Second pass: the values, strictly.
	var o Overrides
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return Overrides{}, jsonError(err, example)
	}
	if err := o.validate(); err != nil {
		return Overrides{}, err
	}
	return o, nil
}

// validate checks every set field on its own, so a bad file is reported before any profile
// is applied.
func (o Overrides) validate() error {
	if o.Profile != "" {
		if _, err := ProfilePolicy(o.Profile); err != nil {
			return fmt.Errorf("profile: %w", err)
		}
	}
	p, _ := ProfilePolicy(DefaultProfile)
	return o.apply(p).Validate()
}

// apply returns p with every set field of o.
func (o Overrides) apply(p Policy) Policy {
	if o.RequireCharging != nil {
		p.RequireCharging = *o.RequireCharging
	}
	if o.BatteryMinLevel != nil {
		p.BatteryMinLevel = *o.BatteryMinLevel
	}
	if o.ThermalMaxState != nil {
		p.ThermalMaxState = *o.ThermalMaxState
	}
	if o.MaxTasksPerMin != nil {
		p.MaxTasksPerMin = *o.MaxTasksPerMin
	}
	if o.PauseOnMetered != nil {
		p.PauseOnMetered = *o.PauseOnMetered
	}
	if o.MaxBytesPerHour != nil {
		p.MaxBytesPerHour = *o.MaxBytesPerHour
	}
	if o.MaxMemoryShare != nil {
		p.MaxMemoryShare = *o.MaxMemoryShare
	}
	return p
}

// jsonError turns a decoding error into one that says where and what to write.
func jsonError(err error, example string) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Errorf("invalid JSON at byte %d (%w): %s", syn.Offset, err, example)
	case errors.As(err, &typ) && typ.Field == "":
		return fmt.Errorf("the file holds a JSON %s, not an object: %s", typ.Value, example)
	case errors.As(err, &typ):
		return fmt.Errorf("field %s: got a JSON %s, want %s", typ.Field, typ.Value, jsonKind(typ.Type))
	}
	return fmt.Errorf("%w: %s", err, example)
}

// jsonKind names what a Go type expects, in the words of JSON.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.String:
		return "a string"
	}
	return t.String()
}

// Deployer returns the deployer's policy: the profile named by the --profile flag, or when
// the flag is empty the file's profile, or else DefaultProfile; then every field the
// overrides set replaces the profile's value. A flag given explicitly wins over the file
// because it is the more specific, more recent choice. The deployer may loosen their own
// profile; only the owner is limited to tightening (see Effective).
func Deployer(profile string, o Overrides) (Policy, error) {
	name := profile
	if name == "" {
		name = o.Profile
	}
	if name == "" {
		name = DefaultProfile
	}
	p, err := ProfilePolicy(name)
	if err != nil {
		return Policy{}, err
	}
	p = o.apply(p)
	if err := p.Validate(); err != nil {
		return Policy{}, fmt.Errorf("participation overrides: %w", err)
	}
	return p, nil
}
