package testnet

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// SensorState is what a node's simulated hardware reports.
type SensorState struct {
	BatteryPresent bool
	BatteryLevel   int  // percent
	Charging       bool //
	TempC          int  // hottest thermal zone, °C
	Metered        bool // default route over a cellular modem (wwan0)
	// Silent removes the whole tree, as if procfs and sysfs stopped answering.
	Silent bool
}

// DefaultSensors is a laptop at 80 % on battery, cool, on Ethernet.
func DefaultSensors() SensorState {
	return SensorState{BatteryPresent: true, BatteryLevel: 80, TempC: 45}
}

// Sensors is one node's simulated hardware: a fake procfs/sysfs tree under a directory that
// the node's capability probe reads as its root (node.Config.ProbeRoot), through the same
// code that reads a real machine. Set rewrites it; the node sees the change at its next
// heartbeat.
type Sensors struct {
	root string

	mu    sync.Mutex
	state SensorState
}

func newSensors(root string, st SensorState) (*Sensors, error) {
	s := &Sensors{root: root}
	return s, s.Set(st)
}

// Root is the tree's directory.
func (s *Sensors) Root() string { return s.root }

// State returns the current simulated state.
func (s *Sensors) State() SensorState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Set rewrites the tree. Each file is replaced atomically (written aside, then renamed), so
// the probe never reads half a value.
func (s *Sensors) Set(st SensorState) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state = st
	if st.Silent {
		for _, d := range []string{"proc", "sys"} {
			if err := os.RemoveAll(filepath.Join(s.root, d)); err != nil {
				return err
			}
		}
		return nil
	}
	status := "Discharging"
	if st.Charging {
		status = "Charging"
	}
	present := "0"
	if st.BatteryPresent {
		present = "1"
	}
	iface := "eth0"
	if st.Metered {
		iface = "wwan0"
	}
	files := map[string]string{
		"proc/meminfo":                         "MemTotal:       16384000 kB\nMemFree:         8192000 kB\nMemAvailable:   12288000 kB\n",
		"proc/net/route":                       "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n" + iface + "\t00000000\t0102A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n",
		"sys/class/power_supply/BAT0/type":     "Battery\n",
		"sys/class/power_supply/BAT0/present":  present + "\n",
		"sys/class/power_supply/BAT0/capacity": fmt.Sprintf("%d\n", st.BatteryLevel),
		"sys/class/power_supply/BAT0/status":   status + "\n",
		"sys/class/thermal/thermal_zone0/type": "x86_pkg_temp\n",
		"sys/class/thermal/thermal_zone0/temp": fmt.Sprintf("%d\n", st.TempC*1000),
	}
	for rel, content := range files {
		p := filepath.Join(s.root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		tmp := p + ".new"
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, p); err != nil {
			return err
		}
	}
	return nil
}
