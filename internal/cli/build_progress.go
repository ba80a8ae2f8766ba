package cli

import (
	"fmt"
	"io"
	"regexp"
	"time"

	"github.com/aenv-dev/aenv/internal/client"
)

// buildLog shows a build's log as it comes. On a terminal a status line
// under the log says which step runs and for how long, redrawn in place;
// elsewhere the log lines alone, so captured output stays readable.
type buildLog struct {
	w       io.Writer
	tty     bool
	quiet   bool
	began   time.Time
	step    string // "[3/7] RUN make"
	stepAt  time.Time
	drawn   bool
	spinner int
}

func newBuildLog(w io.Writer, quiet bool) *buildLog {
	_, tty := terminalFd(w)
	now := time.Now()
	return &buildLog{w: w, tty: tty, quiet: quiet, began: now, stepAt: now}
}

// stepHeader matches the line the server logs when a step starts (or is
// taken from the cache).
var stepHeader = regexp.MustCompile(`^(?:CACHED )?\[\d+/\d+\] `)

func (l *buildLog) entry(e client.BuildLogEntry) {
	if stepHeader.MatchString(e.Message) {
		l.step, l.stepAt = e.Message, time.Now()
	}
	msg := e.Message
	if e.Level == "error" || e.Level == "warn" {
		msg = e.Level + ": " + msg
	}
	l.line(msg)
}

// line prints one log line above the status line.
func (l *buildLog) line(msg string) {
	if l.quiet {
		return
	}
	l.clear()
	fmt.Fprintln(l.w, msg)
	l.tick()
}

// tick redraws the status line.
func (l *buildLog) tick() {
	if l.quiet || !l.tty {
		return
	}
	frames := `|/-\`
	l.spinner = (l.spinner + 1) % len(frames)
	status := fmt.Sprintf("%c building %s", frames[l.spinner], humanDuration(time.Since(l.began)))
	if l.step != "" {
		status += fmt.Sprintf(" · %s (%s)", truncate(l.step, 60), humanDuration(time.Since(l.stepAt)))
	}
	l.clear()
	fmt.Fprint(l.w, status)
	l.drawn = true
}

func (l *buildLog) clear() {
	if l.drawn {
		fmt.Fprint(l.w, "\r\x1b[2K")
		l.drawn = false
	}
}

// done removes the status line.
func (l *buildLog) done() { l.clear() }

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
