package participation

import (
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// maxFuzzSteps bounds a fuzzed trace: long enough for several backoff windows at any
// fuzzed parameters, short enough that one input stays well under a millisecond.
const maxFuzzSteps = 512

// FuzzPolicyHysteresis (Z10, docs/reliability.md) replays a sensor trace decoded from the
// input through a Governor and checks the invariants of TestGovernorTraces after every
// observation (checkTrace): never accepting in a beat that breaches the policy (below the
// battery floor, above the thermal limit, silent sensors, no consent), reasons equal to the
// breaches, no resume before RecoverBeats healthy beats, at most one resume per backoff
// window, none later than the rules allow, and accepting again after a long healthy run.
// Unlike the generated traces there, the fuzzer chooses every reading, gap and profile.
func FuzzPolicyHysteresis(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 128, 80, 0x03, 1})
	for _, s := range hysteresisSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		params, steps := decodeTrace(t, data)
		checkTrace(t, "fuzzed trace", params, steps)
	})
}

// The seeds pause and resume the governor several times each, so the fuzzer starts from
// traces that reach every invariant, not from ones that only ever accept.
func TestHysteresisSeedsPauseAndResume(t *testing.T) {
	for i, s := range hysteresisSeeds() {
		params, steps := decodeTrace(t, s)
		pauses, resumes := checkTrace(t, "seed", params, steps)
		t.Logf("seed %d: %d beats, %d pauses, %d resumes", i, len(steps), pauses, resumes)
		if pauses < 2 || resumes < 2 {
			t.Errorf("seed %d: %d pauses, %d resumes; want at least 2 of each", i, pauses, resumes)
		}
	}
	t.Logf("figure Z10: %d seed traces each pause and resume the governor at least twice", len(hysteresisSeeds()))
}

// hysteresisSeeds encode three traces like TestGovernorTraces's kinds: a battery
// oscillating across the standard floor with short recovery and backoff, sensors falling
// silent now and then, and consent withdrawn for 20 beats while the thermal state wanders
// and the gaps vary (some long).
func hysteresisSeeds() [][]byte {
	sawtooth, silence, consent := []byte{1, 3}, []byte{0, 0}, []byte{1, 0}
	for i := range 120 {
		level := byte(25 + i%35) // across every profile's floor, charging
		sawtooth = append(sawtooth, 128, level, 0x03, 1)
		flags := byte(0x03)
		if i%7 < 3 {
			flags |= 0x08 // silent
		}
		silence = append(silence, byte(i*37), 90, flags, 2)
		prof := byte(1)
		if i >= 40 && i < 60 {
			prof |= 0x80 // consent withdrawn
		}
		consent = append(consent, 255-byte(i%8), 70, 0x03|byte(i%4)<<4, prof)
	}
	return [][]byte{sawtooth, silence, consent}
}

// decodeTrace reads the governor's parameters from the first 2 bytes (even first byte:
// the defaults) and then one heartbeat from every 4 bytes: the gap since the previous
// one, the battery level, flags (battery present, charging, metered, sensors silent, the
// thermal state, the app state) and the profile with the consent bit.
func decodeTrace(t testing.TB, data []byte) (Params, []step) {
	params := DefaultParams(hb)
	if len(data) >= 2 {
		if data[0]%2 == 1 {
			params = Params{RecoverBeats: 1 + int(data[0]/2)%5, BackoffWindow: time.Duration(data[1]%20) * hb}
		}
		data = data[2:]
	}
	profiles := [...]Policy{mustProfile(t, ProfileEco), mustProfile(t, ProfileStandard), mustProfile(t, ProfilePower), mustProfile(t, ProfileOff)}
	apps := [...]string{caps.AppStateForeground, caps.AppStateBackgroundTask, caps.AppStateBackground, ""}
	var steps []step
	for ; len(data) >= 4 && len(steps) < maxFuzzSteps; data = data[4:] {
		gap, level, flags, prof := data[0], data[1], data[2], data[3]
		// A heartbeat of 15 s ± 3 s, or from 250 on a long gap (a suspended laptop).
		dt := hb - 3*time.Second + time.Duration(gap)*6*time.Second/250
		if gap >= 250 {
			dt = time.Duration(2+int(gap-250)*4) * hb
		}
		steps = append(steps, step{
			dt: dt,
			p:  profiles[prof%4],
			c: Conditions{
				BatteryPresent: flags&0x01 != 0,
				BatteryLevel:   int(level) % 101,
				Charging:       flags&0x02 != 0,
				Metered:        flags&0x04 != 0,
				SensorsOK:      flags&0x08 == 0,
				Thermal:        thermals[flags>>4&3],
				AppState:       apps[flags>>6],
			},
			consented: prof&0x80 == 0,
		})
	}
	return params, steps
}
