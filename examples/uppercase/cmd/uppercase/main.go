// Command uppercase is streamctl with a registry of its own: the way to
// deploy a custom job on a Weir cluster (README, "Your own jobs").
//
// Every node of a cluster builds jobs from their registered type name and
// parameters, so every node must run a binary that registers the type. This
// one registers the uppercase job type (examples/uppercase; streamctl has it
// too) and the bundled wordcount, and hands the rest to cli.Main, which
// gives it every streamctl command:
//
//	go build -o uppercase ./examples/uppercase/cmd/uppercase
//	./uppercase jobmanager --data-dir /var/lib/weir/jm
//	./uppercase taskmanager --jobmanager JM:6123        # on each machine
//	./uppercase submit uppercase --jobmanager JM:6123 --set brokers=KAFKA:9092
//
// The job reads the share group "uppercase" on the topic "lines" and writes
// each line upper-cased to the topic "upper", exactly once.
package main

import (
	"fmt"
	"os"

	"github.com/weirstream/weir/cli"
	"github.com/weirstream/weir/examples/uppercase"
	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/runtime"
)

func main() {
	reg := runtime.NewRegistry()
	for _, t := range []runtime.JobType{wordcount.Type, uppercase.Type} {
		if err := reg.Register(t); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	cli.Main(reg)
}
