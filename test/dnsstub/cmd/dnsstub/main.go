// Command dnsstub is the tests' DNS server (package dnsstub) as a process:
//
//	dnsstub -listen 127.1.2.3:53 -zone lab.aenv.test=127.4.5.6 [-zone ...]
//
// answers A queries for each zone and every name under it with its
// address, until SIGINT or SIGTERM. Once it listens it prints
// "listening <addr>" on stdout, for whoever started it to wait on.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/aenv-dev/aenv/test/dnsstub"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "dnsstub:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dnsstub", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:53", "address to answer on, UDP and TCP")
	zones := map[string]netip.Addr{}
	fs.Func("zone", "NAME=IPV4: answer for NAME and every name under it (repeatable)", func(v string) error {
		name, addr, ok := strings.Cut(v, "=")
		if !ok || name == "" {
			return fmt.Errorf("want NAME=IPV4, got %q", v)
		}
		ip, err := netip.ParseAddr(addr)
		if err != nil {
			return err
		}
		zones[name] = ip
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(zones) == 0 {
		return fmt.Errorf("no -zone given")
	}
	s, err := dnsstub.Start(ctx, *listen, zones)
	if err != nil {
		return err
	}
	fmt.Printf("listening %s\n", s.Addr())
	<-ctx.Done()
	return s.Close()
}
