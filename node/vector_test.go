package node

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/participation"
)

// TestOwnVectorIsCaps2: the node announces its hardware in the caps/2 shape (a foreground
// desktop, battery as fractions with the policy's floor, the link type) and pauses for the
// conditions that vector reports.
func TestOwnVectorIsCaps2(t *testing.T) {
	root := t.TempDir()
	for rel, content := range map[string]string{
		"proc/meminfo":                         "MemTotal: 16384000 kB\nMemAvailable: 12288000 kB\n",
		"proc/net/route":                       "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\nwwan0\t00000000\t0102A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n",
		"sys/class/power_supply/BAT0/type":     "Battery\n",
		"sys/class/power_supply/BAT0/capacity": "42\n",
		"sys/class/power_supply/BAT0/status":   "Discharging\n",
		"sys/class/thermal/thermal_zone0/temp": "45000\n",
	} {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	consent := participation.Consent{Version: participation.ConsentVersion, GivenAt: time.Now(), RunLocal: true, Contribute: true,
		BatteryFloor: 45, PauseOnMetered: true}
	n := startTestNode(t, Config{Models: []string{"synth-tiny"}, Consent: &consent, ProbeRoot: root, Heartbeat: time.Minute})
	within(t, 5*time.Second, "the first announcement", func() bool { return n.Own() != nil })
	v := n.Own()
	if v.Runtime != caps.RuntimeDesktop || v.AppState != caps.AppStateForeground {
		t.Fatalf("runtime %q app_state %q, want a foreground desktop", v.Runtime, v.AppState)
	}
	if want := (caps.Battery{Present: true, Level: 0.42, Floor: 0.45}); v.Battery != want {
		t.Fatalf("battery %+v, want %+v (level from the probe, floor from the consent)", v.Battery, want)
	}
	if v.Net.Type != caps.NetCellular || !v.Net.Metered {
		t.Fatalf("net %+v, want a metered cellular link", v.Net)
	}
	data, err := caps.Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := caps.Verify(data, time.Now()); err != nil {
		t.Fatalf("own vector does not verify: %v", err)
	}
	st := n.Status().Participation
	if st.Admission != "paused" || !hasReason(reasons(st.Reasons), participation.ReasonBatteryLow) ||
		!hasReason(reasons(st.Reasons), participation.ReasonMetered) {
		t.Fatalf("participation %+v, want paused for battery_low and metered", st)
	}
}

func reasons(ss []string) []participation.Reason {
	rs := make([]participation.Reason, len(ss))
	for i, s := range ss {
		rs[i] = participation.Reason(s)
	}
	return rs
}
