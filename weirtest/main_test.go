package weirtest_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/weirstream/weir/weirtest"
)

func TestMain(m *testing.M) {
	weirtest.Main() // the broker process of BrokerInChildProcess
	goleak.VerifyTestMain(m)
}
