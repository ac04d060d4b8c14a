// Command streamctl is Weir's command-line interface: the embedded broker,
// the end-to-end demo, the benchmarks and the list of registered job types.
//
// It wires packages together and must hold no logic a test of another
// package would need: anything worth testing on its own lives in the package
// the command calls.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, restore the default behaviour so a second
	// SIGINT kills a command whose clean stop hangs.
	go func() {
		<-ctx.Done()
		stop()
	}()
	err := newRootCmd(os.Stdout, os.Stderr).ExecuteContext(ctx)
	stop()
	if err != nil {
		// cobra has printed the error.
		os.Exit(1)
	}
}
