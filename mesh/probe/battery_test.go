package probe

import (
	"testing"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

func TestReadBattery(t *testing.T) {
	const ps = "sys/class/power_supply/"
	ac := func(online string) map[string]string {
		return map[string]string{ps + "AC/type": "Mains\n", ps + "AC/online": online + "\n"}
	}
	bat := func(name, capacity, status string) map[string]string {
		return map[string]string{
			ps + name + "/type":     "Battery\n",
			ps + name + "/scope":    "System\n",
			ps + name + "/present":  "1\n",
			ps + name + "/capacity": capacity + "\n",
			ps + name + "/status":   status + "\n",
		}
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
		want  caps.Battery
	}{
		{"discharging at 42", merge(ac("0"), bat("BAT0", "42", "Discharging")), caps.Battery{Present: true, Level: 0.42}},
		{"charging", merge(ac("1"), bat("BAT0", "80", "Charging")), caps.Battery{Present: true, Level: 0.8, Charging: true}},
		{"full", merge(ac("1"), bat("BAT0", "100", "Full")), caps.Battery{Present: true, Level: 1, Charging: true}},
		{"not charging on mains (charge threshold)", merge(ac("1"), bat("BAT0", "60", "Not charging")), caps.Battery{Present: true, Level: 0.6, Charging: true}},
		{"not charging on usb-c", merge(bat("BAT0", "60", "Not charging"), map[string]string{
			ps + "ucsi-source-psy-USBC000:001/type": "USB", ps + "ucsi-source-psy-USBC000:001/online": "1"}),
			caps.Battery{Present: true, Level: 0.6, Charging: true}},
		{"not charging off mains", merge(ac("0"), bat("BAT0", "60", "Not charging")), caps.Battery{Present: true, Level: 0.6}},
		{"desktop on mains", ac("1"), caps.Battery{}},
		{"no power supply class", nil, caps.Battery{}},
		{"hid battery with scope Device is ignored", merge(ac("1"), map[string]string{
			ps + "hidpp_battery_0/type":     "Battery",
			ps + "hidpp_battery_0/scope":    "Device",
			ps + "hidpp_battery_0/capacity": "55",
			ps + "hidpp_battery_0/status":   "Discharging",
		}), caps.Battery{}},
		{"hid battery beside a laptop battery", merge(bat("BAT0", "30", "Discharging"), map[string]string{
			ps + "hidpp_battery_0/type":     "Battery",
			ps + "hidpp_battery_0/scope":    "Device",
			ps + "hidpp_battery_0/capacity": "100",
			ps + "hidpp_battery_0/status":   "Charging",
		}), caps.Battery{Present: true, Level: 0.3}},
		{"removed battery bay", merge(ac("1"), bat("BAT1", "0", "Unknown"), map[string]string{ps + "BAT1/present": "0"}), caps.Battery{}},
		{"two batteries average", merge(bat("BAT0", "40", "Discharging"), bat("BAT1", "81", "Discharging")), caps.Battery{Present: true, Level: 0.61}},
		{"capacity above 100 clamped", bat("BAT0", "150", "Discharging"), caps.Battery{Present: true, Level: 1}},
		{"negative capacity clamped", bat("BAT0", "-3", "Discharging"), caps.Battery{Present: true, Level: 0}},
		{"energy fallback", map[string]string{
			ps + "BAT0/type": "Battery", ps + "BAT0/energy_now": "25000000", ps + "BAT0/energy_full": "50000000",
			ps + "BAT0/status": "Discharging"}, caps.Battery{Present: true, Level: 0.5}},
		{"charge fallback", map[string]string{
			ps + "BAT0/type": "Battery", ps + "BAT0/charge_now": "750", ps + "BAT0/charge_full": "1000"},
			caps.Battery{Present: true, Level: 0.75}},
		{"unreadable level reads empty", map[string]string{
			ps + "BAT0/type": "Battery", ps + "BAT0/capacity": "lots", ps + "BAT0/status": "Charging"},
			caps.Battery{Present: true, Level: 0, Charging: true}},
		{"garbage everywhere", map[string]string{
			ps + "X/type": "\x00\xffBattery", ps + "X/capacity": "\xff\xff", ps + "Y/type": "",
			ps + "Z/online": "1"}, caps.Battery{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := newTree(t, tc.files)
			if got := readBattery(root); got != tc.want {
				t.Fatalf("readBattery = %+v, want %+v", got, tc.want)
			}
		})
	}
}
