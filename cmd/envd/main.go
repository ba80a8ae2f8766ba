// Command envd is the in-sandbox agent: it speaks the E2B envd protocol
// and, started as PID 1, is also the sandbox's init, reaping the orphans
// that reparent to it.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/aenv-dev/aenv/internal/envd"
)

// options are envd's command-line flags.
type options struct {
	init        bool
	port        int
	listenAddr  string
	defaultUser string
	passwdPath  string
	groupPath   string
}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	os.Exit(run(os.Args[1:], log))
}

func run(args []string, log *slog.Logger) int {
	opts, err := parseFlags(args, os.Stderr)
	if err != nil {
		return 2
	}
	// SIGTERM ends envd, and with it (as init) the sandbox.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	children := envd.NewReaper()
	if opts.init || os.Getpid() == 1 {
		if os.Getpid() != 1 {
			// Outside a sandbox (--init), the orphans of envd's processes
			// come to envd as they would to PID 1.
			if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
				log.Error("become a subreaper", "err", err)
				return 1
			}
		}
		go children.Run(ctx, log)
	}
	if err := runServe(ctx, opts, children, log); err != nil {
		log.Error("envd failed", "err", err)
		return 1
	}
	return 0
}

func parseFlags(args []string, out io.Writer) (options, error) {
	var opts options
	fs := flag.NewFlagSet("envd", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.BoolVar(&opts.init, "init", false, "act as init: reap the orphans of envd's processes (implied when PID 1)")
	fs.IntVar(&opts.port, "port", 49983, "TCP port to serve the envd protocol on")
	fs.StringVar(&opts.listenAddr, "listen-addr", "0.0.0.0", "address to listen on")
	fs.StringVar(&opts.defaultUser, "default-user", "root", "user for requests that name none, until /init sets one")
	fs.StringVar(&opts.passwdPath, "passwd", "/etc/passwd", "account file users are looked up in")
	fs.StringVar(&opts.groupPath, "group", "/etc/group", "group file supplementary groups are looked up in")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(out, "envd: unexpected arguments %q\n", fs.Args())
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return opts, nil
}
