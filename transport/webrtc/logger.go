package webrtc

import (
	"fmt"

	logging "github.com/ipfs/go-log/v2"
	pionlogging "github.com/pion/logging"
)

var log = logging.Logger("transport/webrtc")

// pionLog receives pion's logs, each demoted one level: pion logs routine events of a
// connection's life (a peer going away, a late packet, a stream reset race) as errors and
// warnings, which from a node's point of view are information at most. Its debug and trace
// output (per packet) is dropped.
var pionLog = logging.Logger("transport/webrtc/pion")

// pionLogger adapts pion's leveled logger to pionLog; scope is pion's subsystem ("ice",
// "sctp", …), put in front of each message.
type pionLogger struct{ scope string }

var _ pionlogging.LeveledLogger = pionLogger{}

func (pionLogger) Trace(string)          {}
func (pionLogger) Tracef(string, ...any) {}
func (pionLogger) Debug(string)          {}
func (pionLogger) Debugf(string, ...any) {}

func (l pionLogger) Info(msg string) { pionLog.Debugf("%s: %s", l.scope, msg) }
func (l pionLogger) Infof(format string, args ...any) {
	if pionLog.LevelEnabled(logging.LevelDebug) {
		pionLog.Debugf("%s: %s", l.scope, fmt.Sprintf(format, args...))
	}
}

func (l pionLogger) Warn(msg string) { pionLog.Infof("%s: %s", l.scope, msg) }
func (l pionLogger) Warnf(format string, args ...any) {
	if pionLog.LevelEnabled(logging.LevelInfo) {
		pionLog.Infof("%s: %s", l.scope, fmt.Sprintf(format, args...))
	}
}

func (l pionLogger) Error(msg string) { pionLog.Warnf("%s: %s", l.scope, msg) }
func (l pionLogger) Errorf(format string, args ...any) {
	if pionLog.LevelEnabled(logging.LevelWarn) {
		pionLog.Warnf("%s: %s", l.scope, fmt.Sprintf(format, args...))
	}
}

// loggerFactory is the pion LoggerFactory of every Transport's SettingEngine.
type loggerFactory struct{}

var _ pionlogging.LoggerFactory = loggerFactory{}

// NewLogger returns a logger for one pion subsystem. pion asks for many (one per data
// channel); the value holds only the scope string.
func (loggerFactory) NewLogger(scope string) pionlogging.LeveledLogger {
	return pionLogger{scope: scope}
}
