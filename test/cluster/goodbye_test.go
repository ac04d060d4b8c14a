package cluster

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/weirstream/weir/runtime"
)

// A task manager stopped on purpose (SIGTERM: its context ends) says
// goodbye: the job manager logs the session's end at info, saying it
// stopped, and warns of nothing ("connection ended without a goodbye"
// was a WARN at every clean stop and at the demo's end).
func TestATaskManagerStoppedCleanlySaysGoodbyeAndNoOneWarns(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	c := startCluster(t, runtime.NewRegistry(), zap.New(core), nil)
	c.startTM("tm-1")
	waitUntil(t, time.Minute, "the task manager registered", func() bool { return len(c.srv.TaskManagers()) == 1 })
	c.stopTM("tm-1")
	waitUntil(t, time.Minute, "the session ended", func() bool { return len(c.srv.TaskManagers()) == 0 })
	waitUntil(t, time.Minute, "the end logged", func() bool {
		return logs.FilterMessage("task manager session ended").Len()+logs.FilterMessage("task manager lost").Len() > 0
	})
	for _, e := range logs.All() {
		if e.Level >= zapcore.WarnLevel {
			t.Errorf("%s %s: %q %v", e.LoggerName, e.Level, e.Message, e.ContextMap())
		}
	}
	ended := logs.FilterMessage("task manager session ended").All()
	if len(ended) != 1 || !strings.Contains(ended[0].ContextMap()["error"].(string), "the task manager stopped (task manager tm-1 is stopping)") {
		t.Errorf("the job manager logged %v, want one \"task manager session ended\" saying it stopped", ended)
	}
}
