package participation

import (
	"math"
	"time"
)

// ReasonBandwidthCap: max_bytes_per_hour is set and the mesh traffic of the tasks this node
// served in the last hour (TrafficMeter) has reached it. It is a breach like the device's
// (TrafficBreaches reports it), but of the node's own accounting, so silent sensors do not
// hide it.
const ReasonBandwidthCap Reason = "bandwidth_cap"

// TrafficWindow is the span max_bytes_per_hour counts over (one hour), sliding.
const TrafficWindow = time.Hour

// trafficSlot is TrafficMeter's resolution (one minute): bytes are counted per minute.
const trafficSlot = time.Minute

// trafficSlots is how many minutes TrafficMeter keeps: the hour, and the current minute.
const trafficSlots = int64(TrafficWindow/trafficSlot) + 1

// TrafficMeter counts the bytes moved in the last TrafficWindow, to the minute. It keeps one
// count per minute of the clock (a slot, [k min, k+1 min)): Total is the sum of the current
// minute's slot and the 60 before it. So bytes moved at t count until the first minute
// boundary at least an hour after t: for at least an hour and less than an hour and a minute,
// never less than the window, and a cap is never let through early. Its memory is 61 counts,
// whatever the traffic.
//
// A clock that goes backwards adds to the newest slot: bytes are never lost, and they leave
// the window no earlier than that slot does. Counts saturate at math.MaxInt64. The zero value
// is ready to use. A TrafficMeter is not safe for concurrent use; its owner holds a lock
// around it.
type TrafficMeter struct {
	slots  [trafficSlots]int64 // slots[slotOf(k)] is minute k's count
	newest int64               // the minute of the newest slot in use
	total  int64               // the sum of slots
	used   bool                // newest is set
}

// Add counts n bytes moved at now. n of 0 or below counts nothing.
func (m *TrafficMeter) Add(n int64, now time.Time) {
	if n <= 0 {
		return
	}
	m.advance(now)
	i := slotOf(m.newest)
	m.slots[i] = satAdd(m.slots[i], n)
	m.total = satAdd(m.total, n)
}

// Total is the bytes counted in the window that ends at now (see TrafficMeter).
func (m *TrafficMeter) Total(now time.Time) int64 {
	m.advance(now)
	return m.total
}

// advance moves the window to now's minute, dropping the slots that left it.
func (m *TrafficMeter) advance(now time.Time) {
	k := minuteOf(now)
	if !m.used {
		m.newest, m.used = k, true
		return
	}
	if k <= m.newest {
		return // the same minute, or a clock that went backwards
	}
	if k-m.newest >= trafficSlots {
		m.slots, m.total = [trafficSlots]int64{}, 0
	} else {
		for j := m.newest + 1; j <= k; j++ {
			i := slotOf(j)
			m.total -= m.slots[i]
			m.slots[i] = 0
		}
	}
	m.newest = k
}

// minuteOf is the minute of the clock t falls in, counted from the Unix epoch (floored, so
// that times before it fall in negative minutes rather than in minute 0).
func minuteOf(t time.Time) int64 {
	s := t.Unix()
	k := s / 60
	if s%60 < 0 {
		k--
	}
	return k
}

// slotOf is minute k's index in TrafficMeter.slots.
func slotOf(k int64) int {
	i := int(k % trafficSlots)
	if i < 0 {
		i += int(trafficSlots)
	}
	return i
}

// satAdd is a+b for non-negative a and b, at most math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// OverCap reports whether lastHour bytes of mesh traffic reach policy p's cap: a set
// MaxBytesPerHour that lastHour is at or above.
func OverCap(p Policy, lastHour int64) bool {
	return p.MaxBytesPerHour > 0 && lastHour >= p.MaxBytesPerHour
}

// TrafficBreaches returns [bandwidth_cap] when lastHour bytes of mesh traffic reach p's cap
// (OverCap), else nil. Its breach comes after those of Breaches in a Governor's reasons.
func TrafficBreaches(p Policy, lastHour int64) []Reason {
	if OverCap(p, lastHour) {
		return []Reason{ReasonBandwidthCap}
	}
	return nil
}
