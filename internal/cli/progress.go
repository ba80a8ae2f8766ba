package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/aenv-dev/aenv/internal/client"
)

// pullProgress draws build progress: on a terminal, one bar per layer
// redrawn in place plus a status line; elsewhere, a line per layer start
// and finish and per phase, so logs stay readable.
type pullProgress struct {
	w      io.Writer
	tty    bool
	order  []string
	layers map[string]client.BuildEvent
	status string
	drawn  int // lines drawn last time (tty)
}

func newPullProgress(w io.Writer, tty bool) *pullProgress {
	return &pullProgress{w: w, tty: tty, layers: map[string]client.BuildEvent{}}
}

func (p *pullProgress) update(ev client.BuildEvent) {
	if ev.Layer == "" {
		if ev.Phase == p.status {
			return
		}
		p.status = ev.Phase
		if !p.tty {
			fmt.Fprintln(p.w, phaseLine(ev))
		}
	} else {
		prev, seen := p.layers[ev.Layer]
		if !seen {
			p.order = append(p.order, ev.Layer)
		}
		p.layers[ev.Layer] = ev
		if !p.tty && (!seen || prev.Phase != ev.Phase) {
			fmt.Fprintln(p.w, layerLine(ev, false))
		}
	}
	if p.tty {
		p.redraw()
	}
}

// redraw moves the cursor up over the previous drawing and writes it anew.
func (p *pullProgress) redraw() {
	var b strings.Builder
	if p.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", p.drawn)
	}
	for _, l := range p.order {
		b.WriteString("\x1b[2K" + layerLine(p.layers[l], true) + "\n")
	}
	lines := len(p.order)
	if p.status != "" {
		b.WriteString("\x1b[2K" + p.status + "\n")
		lines++
	}
	p.drawn = lines
	io.WriteString(p.w, b.String())
}

func phaseLine(ev client.BuildEvent) string {
	if ev.Message != "" {
		return ev.Phase + ": " + ev.Message
	}
	return ev.Phase
}

func layerLine(ev client.BuildEvent, withBar bool) string {
	line := fmt.Sprintf("%s  %-11s", shortDigest(ev.Layer), ev.Phase)
	if withBar && ev.Total > 0 {
		line += " " + bar(ev.Current, ev.Total, 30)
	}
	if ev.Total > 0 {
		line += fmt.Sprintf(" %s/%s", humanBytes(ev.Current), humanBytes(ev.Total))
	}
	return line
}

// bar draws [=====>     ] for current of total.
func bar(current, total int64, width int) string {
	filled := int(float64(width) * float64(min(max(current, 0), total)) / float64(total))
	if filled >= width {
		return "[" + strings.Repeat("=", width) + "]"
	}
	return "[" + strings.Repeat("=", filled) + ">" + strings.Repeat(" ", width-filled-1) + "]"
}
