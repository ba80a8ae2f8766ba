// Command aenv is the aenv server and command-line client.
package main

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/aenv-dev/aenv/internal/cli"
	"github.com/aenv-dev/aenv/internal/runtime/gvisor/ckptgofer"
)

func main() {
	if filepath.Base(os.Args[0]) == ckptgofer.ProcessName {
		// runsc started aenv as its checkpoint gofer, for a restore that
		// reads an image still being fetched (see internal/runtime/gvisor).
		os.Exit(ckptgofer.Main(os.Args[1:], os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
