package probe

import (
	"os"
	"path/filepath"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// Power supply attribute values, as the kernel spells them (Documentation/ABI/testing/
// sysfs-class-power).
const (
	supplyBattery      = "Battery"
	supplyMains        = "Mains"
	supplyUSB          = "USB"
	scopeDevice        = "Device" // powers a peripheral (mouse, keyboard), not this machine
	statusCharging     = "Charging"
	statusFull         = "Full"
	statusNotCharging  = "Not charging"
	batteryFullPercent = 100
)

// readBattery reads the system battery state under root.
//
// Every supply of type "Battery" counts unless its scope is "Device" or its present attribute
// is 0. Level is the mean of their levels, each from capacity (clamped to 0-100), else
// energy_now/energy_full or charge_now/charge_full, else 0, as a fraction of a full charge
// (the mean of the whole percentages, divided by 100): a battery whose level cannot be read
// is reported empty rather than full, so that policy errs on the side of sparing it. Charging is
// true when a battery's status is "Charging" or "Full", or when it is "Not charging" (held by a
// charge threshold) while a Mains or USB supply is online. With no battery the machine is a
// desktop on mains: Present false, Level 0, Charging false. Floor is left 0: it is the
// participation policy's, not the hardware's.
func readBattery(root string) caps.Battery {
	dir := under(root, "/sys/class/power_supply")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return caps.Battery{}
	}
	var (
		n, levels             int
		charging, notCharging bool
		external              bool
	)
	for _, e := range ents {
		d := filepath.Join(dir, e.Name())
		if scope, _ := readString(filepath.Join(d, "scope")); scope == scopeDevice {
			continue
		}
		typ, _ := readString(filepath.Join(d, "type"))
		switch typ {
		case supplyBattery:
			if present, ok := readInt(filepath.Join(d, "present")); ok && present == 0 {
				continue
			}
			n++
			levels += batteryLevel(d)
			switch status, _ := readString(filepath.Join(d, "status")); status {
			case statusCharging, statusFull:
				charging = true
			case statusNotCharging:
				notCharging = true
			}
		case supplyMains, supplyUSB:
			if online, ok := readInt(filepath.Join(d, "online")); ok && online == 1 {
				external = true
			}
		}
	}
	if n == 0 {
		return caps.Battery{}
	}
	return caps.Battery{
		Present:  true,
		Level:    float64((levels+n/2)/n) / batteryFullPercent,
		Charging: charging || notCharging && external,
	}
}

// batteryLevel returns one battery's charge in percent, 0-100.
func batteryLevel(d string) int {
	if c, ok := readInt(filepath.Join(d, "capacity")); ok {
		return int(clamp(c, 0, batteryFullPercent))
	}
	for _, kind := range []string{"energy", "charge"} {
		now, ok1 := readInt(filepath.Join(d, kind+"_now"))
		full, ok2 := readInt(filepath.Join(d, kind+"_full"))
		if ok1 && ok2 && full > 0 && now >= 0 && now <= full {
			return int(float64(now) * batteryFullPercent / float64(full)) // float: now·100 may overflow
		}
	}
	return 0
}

func clamp(v, lo, hi int64) int64 {
	return max(lo, min(v, hi))
}
