package probe

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// Thermal thresholds, in millidegrees Celsius (the unit of sysfs thermal_zone*/temp), applied to
// the hottest zone. Desktop and laptop CPUs and GPUs have a junction limit (Tjmax) of 95-105 °C
// and their firmware throttles near it; the states follow how close the hottest sensor is.
const (
	// fairMilliC: 70 °C is where a sustained load on a laptop sits and fans run audibly; work
	// still runs at full speed.
	fairMilliC = 70_000
	// seriousMilliC: 85 °C is within 10-20 °C of Tjmax; turbo is cut, throughput drops.
	seriousMilliC = 85_000
	// criticalMilliC: 95 °C is at the lowest common Tjmax; the chip throttles hard and the
	// kernel may shut down at the zone's critical trip.
	criticalMilliC = 95_000
	// maxPlausibleMilliC: readings above 150 °C exceed any silicon's rating and are sensor
	// sentinels or garbage; they, and readings at or below 0 °C (unconnected sensors), are
	// ignored.
	maxPlausibleMilliC = 150_000
	// maxTripPoints bounds the trip points examined per zone; real zones have fewer than 16.
	maxTripPoints = 32
)

// Trip point types that raise the state (Documentation/driver-api/thermal/sysfs-api.rst).
const (
	tripHot      = "hot"      // at or above: serious
	tripCritical = "critical" // at or above: critical (the kernel shuts down here)
)

// Severities order the caps thermal states; the worst zone wins.
const (
	sevNominal = iota
	sevFair
	sevSerious
	sevCritical
)

func severityName(s int) string {
	switch s {
	case sevFair:
		return caps.ThermalFair
	case sevSerious:
		return caps.ThermalSerious
	case sevCritical:
		return caps.ThermalCritical
	default:
		return caps.ThermalNominal
	}
}

// tempSeverity maps a temperature in millidegrees Celsius to a severity.
func tempSeverity(milliC int64) int {
	switch {
	case milliC >= criticalMilliC:
		return sevCritical
	case milliC >= seriousMilliC:
		return sevSerious
	case milliC >= fairMilliC:
		return sevFair
	default:
		return sevNominal
	}
}

// readThermal returns the thermal state under root: the worst over all thermal zones of the
// state from the zone's temperature and the state from its trip points (at or above a "hot"
// trip: serious; at or above a "critical" trip: critical). No zone, or no readable temperature,
// is nominal.
func readThermal(root string) string {
	dir := under(root, "/sys/class/thermal")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return caps.ThermalNominal
	}
	worst := sevNominal
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "thermal_zone") {
			continue
		}
		worst = max(worst, zoneSeverity(filepath.Join(dir, e.Name())))
		if worst == sevCritical {
			break
		}
	}
	return severityName(worst)
}

// zoneSeverity reads one thermal zone directory.
func zoneSeverity(d string) int {
	t, ok := readInt(filepath.Join(d, "temp"))
	if !ok || t <= 0 || t > maxPlausibleMilliC {
		return sevNominal
	}
	sev := tempSeverity(t)
	for i := 0; i < maxTripPoints && sev < sevCritical; i++ {
		prefix := filepath.Join(d, "trip_point_"+strconv.Itoa(i)+"_")
		typ, ok := readString(prefix + "type")
		if !ok {
			break // trip points are numbered from 0 without gaps
		}
		var tripSev int
		switch typ {
		case tripHot:
			tripSev = sevSerious
		case tripCritical:
			tripSev = sevCritical
		default:
			continue
		}
		// A trip at or below 0 °C is disabled or unset.
		if trip, ok := readInt(prefix + "temp"); ok && trip > 0 && t >= trip {
			sev = max(sev, tripSev)
		}
	}
	return sev
}
