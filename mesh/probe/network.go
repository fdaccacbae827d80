package probe

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// Link detection. Linux exposes no "metered" attribute: NetworkManager keeps that per
// connection. The probe classifies the interface that carries the default route, and takes a
// cellular link as metered: a cellular modem (DEVTYPE=wwan in its uevent, or a name of the
// kernel's cellular and point-to-point drivers, or USB tethering) is metered; Ethernet and
// Wi-Fi are not (a phone hotspot seen over Wi-Fi is not detected: the owner's pause_on_metered
// cannot see it, and the README says so).
var meteredPrefixes = []string{"wwan", "ppp", "rmnet", "wwp", "usb"}

// arphrdEther is the sysfs "type" of Ethernet-framed interfaces (ARPHRD_ETHER).
const arphrdEther = 1

// readNetType classifies the link of the default route as a caps.Net* type: cellular (see
// meteredPrefixes), wifi (DEVTYPE=wlan, a wireless directory, or a wl* name), bluetooth
// (DEVTYPE=bluetooth or a bnep* name), ethernet (an eth* or en* name, or an Ethernet-framed
// interface without a DEVTYPE), other (bridges, VPN tunnels, ...), or unknown when there is
// no default route.
func readNetType(root string) string {
	dev := defaultRouteDevice(root)
	if dev == "" || strings.ContainsAny(dev, "/.") {
		return caps.NetUnknown
	}
	for _, p := range meteredPrefixes {
		if strings.HasPrefix(dev, p) {
			return caps.NetCellular
		}
	}
	sys := under(root, "/sys/class/net/"+dev)
	var devtype string
	if b, err := readFile(filepath.Join(sys, "uevent")); err == nil {
		for line := range bytes.Lines(b) {
			if v, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("DEVTYPE=")); ok {
				devtype = string(v)
			}
		}
	}
	switch devtype {
	case "wwan":
		return caps.NetCellular
	case "wlan":
		return caps.NetWiFi
	case "bluetooth":
		return caps.NetBluetooth
	}
	if fi, err := os.Stat(filepath.Join(sys, "wireless")); err == nil && fi.IsDir() {
		return caps.NetWiFi
	}
	switch {
	case strings.HasPrefix(dev, "wl"):
		return caps.NetWiFi
	case strings.HasPrefix(dev, "bnep"):
		return caps.NetBluetooth
	case devtype != "":
		return caps.NetOther
	case strings.HasPrefix(dev, "eth"), strings.HasPrefix(dev, "en"):
		return caps.NetEthernet
	}
	if typ, ok := readInt(filepath.Join(sys, "type")); ok && typ == arphrdEther {
		return caps.NetEthernet
	}
	return caps.NetOther
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
