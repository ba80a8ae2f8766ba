// Command envd is the in-sandbox agent. Started as PID 1 it becomes a tiny
// init that supervises `envd serve` and reaps orphans; `envd serve` speaks
// the E2B envd protocol.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
)

// options are envd's command-line flags.
type options struct {
	init        bool
	port        int
	listenAddr  string
	defaultUser string
	passwdPath  string
	groupPath   string
	// stateFD and listenFD are set by the init for its serve child: the
	// socket the settings are handed over on, and the listening socket the
	// init keeps open across restarts.
	stateFD  int
	listenFD int
}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	os.Exit(run(os.Args[1:], log))
}

func run(args []string, log *slog.Logger) int {
	serve := len(args) > 0 && args[0] == "serve"
	if serve {
		args = args[1:]
	}
	opts, err := parseFlags(args, os.Stderr)
	if err != nil {
		return 2
	}
	if !serve && (opts.init || os.Getpid() == 1) {
		return superviseServe(opts, log)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := runServe(ctx, opts, log); err != nil {
		log.Error("envd failed", "err", err)
		return 1
	}
	return 0
}

func parseFlags(args []string, out io.Writer) (options, error) {
	var opts options
	fs := flag.NewFlagSet("envd", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.BoolVar(&opts.init, "init", false, "act as init: supervise `envd serve` and reap zombies (implied when PID 1)")
	fs.IntVar(&opts.port, "port", 49983, "TCP port to serve the envd protocol on")
	fs.StringVar(&opts.listenAddr, "listen-addr", "0.0.0.0", "address to listen on")
	fs.StringVar(&opts.defaultUser, "default-user", "root", "user for requests that name none, until /init sets one")
	fs.StringVar(&opts.passwdPath, "passwd", "/etc/passwd", "account file users are looked up in")
	fs.StringVar(&opts.groupPath, "group", "/etc/group", "group file supplementary groups are looked up in")
	fs.IntVar(&opts.stateFD, "state-fd", 0, "serve: inherited socket to the init that keeps the /init settings (set by the init)")
	fs.IntVar(&opts.listenFD, "listen-fd", 0, "serve: inherited listening socket to serve on (set by the init)")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(out, "envd: unexpected arguments %q\n", fs.Args())
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return opts, nil
}

// serveArgs are the arguments the init re-executes itself with; the serve
// child finds its state socket and listener at childStateFD and
// childListenFD.
func serveArgs(opts options) []string {
	return []string{
		"serve",
		"--port", strconv.Itoa(opts.port),
		"--listen-addr", opts.listenAddr,
		"--default-user", opts.defaultUser,
		"--passwd", opts.passwdPath,
		"--group", opts.groupPath,
		"--state-fd", strconv.Itoa(childStateFD),
		"--listen-fd", strconv.Itoa(childListenFD),
	}
}
