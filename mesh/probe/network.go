package probe

import (
	"bufio"
	"bytes"
	"os"
	"strings"
)

// Metered-link detection. Linux exposes no "metered" attribute: NetworkManager keeps that per
// connection. The probe infers it from the interface that carries the default route: a
// cellular modem (DEVTYPE=wwan in its uevent, or a name of the kernel's cellular and
// point-to-point drivers) is metered; Ethernet and Wi-Fi are not (a phone hotspot seen over
// Wi-Fi is not detected: the owner's pause_on_metered cannot see it, and the README says so).
var meteredPrefixes = []string{"wwan", "ppp", "rmnet", "wwp", "usb"}

// readMetered reports whether the default route leaves through a metered (cellular) link.
func readMetered(root string) bool {
	dev := defaultRouteDevice(root)
	if dev == "" || strings.ContainsAny(dev, "/.") {
		return false
	}
	for _, p := range meteredPrefixes {
		if strings.HasPrefix(dev, p) {
			return true
		}
	}
	b, err := readFile(under(root, "/sys/class/net/"+dev+"/uevent"))
	if err != nil {
		return false
	}
	for line := range bytes.Lines(b) {
		if string(bytes.TrimSpace(line)) == "DEVTYPE=wwan" {
			return true
		}
	}
	return false
}

// defaultRouteDevice is the interface of the IPv4 default route with the lowest metric in
// /proc/net/route, or "" when there is none.
func defaultRouteDevice(root string) string {
	b, err := readFile(under(root, "/proc/net/route"))
	if err != nil {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	best, bestMetric := "", int64(-1)
	for sc.Scan() {
		// Iface Destination Gateway Flags RefCnt Use Metric Mask MTU Window IRTT
		f := strings.Fields(sc.Text())
		if len(f) < 8 || f[1] != "00000000" || f[7] != "00000000" {
			continue
		}
		var metric int64
		for _, c := range f[6] {
			if c < '0' || c > '9' {
				metric = -1
				break
			}
			metric = metric*10 + int64(c-'0')
		}
		if metric >= 0 && (bestMetric < 0 || metric < bestMetric) {
			best, bestMetric = f[0], metric
		}
	}
	return best
}

// sensorsAnswer reports whether the system files the probe reads are there at all: procfs
// (meminfo) and sysfs (/sys/class). When they vanish the conditions are unknown, and the
// participation policy pauses rather than trust defaults (fail closed).
func sensorsAnswer(root string) bool {
	if _, err := readFile(under(root, "/proc/meminfo")); err != nil {
		return false
	}
	fi, err := os.Stat(under(root, "/sys/class"))
	return err == nil && fi.IsDir()
}
