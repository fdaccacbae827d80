package probe

import (
	"fmt"
	"testing"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

func TestReadThermal(t *testing.T) {
	zone := func(i int, temp string, trips ...string) map[string]string {
		d := fmt.Sprintf("sys/class/thermal/thermal_zone%d/", i)
		m := map[string]string{d + "type": "x86_pkg_temp\n", d + "temp": temp + "\n"}
		for j := 0; j+1 < len(trips); j += 2 {
			m[fmt.Sprintf("%strip_point_%d_type", d, j/2)] = trips[j] + "\n"
			m[fmt.Sprintf("%strip_point_%d_temp", d, j/2)] = trips[j+1] + "\n"
		}
		return m
	}
	merge := func(ms ...map[string]string) map[string]string {
		out := map[string]string{}
		for _, m := range ms {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"no zones", nil, caps.ThermalNominal},
		{"cool", zone(0, "45000"), caps.ThermalNominal},
		{"just below fair", zone(0, "69999"), caps.ThermalNominal},
		{"fair at 70", zone(0, "70000"), caps.ThermalFair},
		{"serious at 85", zone(0, "85000"), caps.ThermalSerious},
		{"serious at 94.9", zone(0, "94999"), caps.ThermalSerious},
		{"critical at 95", zone(0, "95000"), caps.ThermalCritical},
		{"hottest zone wins", merge(zone(0, "40000"), zone(1, "88000"), zone(2, "71000")), caps.ThermalSerious},
		{"hot trip reached", zone(0, "65000", "passive", "50000", "hot", "60000", "critical", "105000"), caps.ThermalSerious},
		{"critical trip reached", zone(0, "81000", "hot", "70000", "critical", "80000"), caps.ThermalCritical},
		{"trips not reached", zone(0, "55000", "passive", "50000", "hot", "60000", "critical", "80000"), caps.ThermalNominal},
		{"passive and active trips ignored", zone(0, "65000", "passive", "40000", "active", "45000"), caps.ThermalNominal},
		{"disabled trip at 0 ignored", zone(0, "30000", "critical", "0"), caps.ThermalNominal},
		{"trips after a gap ignored", merge(zone(0, "65000"), map[string]string{
			"sys/class/thermal/thermal_zone0/trip_point_1_type": "critical",
			"sys/class/thermal/thermal_zone0/trip_point_1_temp": "60000"}), caps.ThermalNominal},
		{"cooling devices ignored", map[string]string{"sys/class/thermal/cooling_device0/cur_state": "99000"}, caps.ThermalNominal},
		{"unconnected sensor ignored", zone(0, "-273000", "critical", "-300000"), caps.ThermalNominal},
		{"sentinel ignored", zone(0, "255000"), caps.ThermalNominal},
		{"garbage temp", merge(zone(0, "hot!"), zone(1, "\xff\x00")), caps.ThermalNominal},
		{"garbage trip", zone(0, "60000", "critical", "soon"), caps.ThermalNominal},
		{"truncated", zone(0, "9"), caps.ThermalNominal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := readThermal(newTree(t, tc.files)); got != tc.want {
				t.Fatalf("readThermal = %q, want %q", got, tc.want)
			}
		})
	}
}
