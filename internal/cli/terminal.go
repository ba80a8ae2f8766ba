package cli

import (
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
)

// localTerminal is our side of an interactive session: the terminal in
// raw mode (so Ctrl-C, arrows and colours go to the remote shell as
// bytes), its size, and its resizes.
type localTerminal struct {
	cols, rows uint32
	resizes    <-chan envdclient.PTYSize // nil without a terminal
	restore    func()
}

// openTerminal puts stdin in raw mode when it is a terminal. Without one
// (a pipe, a test) the session still runs, at 80x24, with input as is.
func (a *app) openTerminal() (*localTerminal, error) {
	t := &localTerminal{cols: 80, rows: 24, restore: func() {}}
	inFd, ok := terminalFd(a.stdin)
	if !ok {
		return t, nil
	}
	sizeFd := inFd
	if outFd, ok := terminalFd(a.stdout); ok {
		sizeFd = outFd
	}
	if w, h, err := term.GetSize(sizeFd); err == nil && w > 0 && h > 0 {
		t.cols, t.rows = uint32(w), uint32(h)
	}
	state, err := term.MakeRaw(inFd)
	if err != nil {
		return nil, err
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	sizes := make(chan envdclient.PTYSize, 1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-winch:
				if w, h, err := term.GetSize(sizeFd); err == nil {
					select {
					case sizes <- envdclient.PTYSize{Cols: uint32(w), Rows: uint32(h)}:
					default: // a resize is already pending; the next read gets the latest size
					}
				}
			}
		}
	}()
	t.resizes = sizes
	t.restore = func() {
		signal.Stop(winch)
		close(done)
		_ = term.Restore(inFd, state)
	}
	return t, nil
}
