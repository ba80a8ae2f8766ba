package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/errdefs"
	"github.com/aenv-dev/aenv/internal/wire"
)

// logsPollInterval is how often --follow asks for new entries.
const logsPollInterval = time.Second

// maxLogPage is the server's largest page of log entries (E2B's).
const maxLogPage = 1000

func (a *app) logsCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	var q client.LogQuery
	var since string
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs SANDBOX",
		Short: "Show a sandbox's own log: what its envd logged",
		Long: `Show what a sandbox's envd (its init) logged since the sandbox last started or resumed on its
node: processes started and ended (the command, never its arguments or environment), processes that
failed to start, and envd's own warnings and errors. The newest --tail entries (at most 1000) are
printed oldest first; --follow then prints new ones as they come, until the sandbox ends or you press
Ctrl-C. The log is a file on the node beside the sandbox, of which the newest MiB is served; a
sandbox paused to disk, restored or forked starts a new one. Control characters a process in the
sandbox wrote are printed quoted.

-o json prints one JSON object per line (E2B's log entry: timestamp, level, message, fields).`,
		Example: "  aenv logs sbx_123\n  aenv logs sbx_123 --level warn --since 10m\n  aenv logs sbx_123 -f -o json | jq .message",
		Args:    args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			if q.Limit < 1 || q.Limit > 1000 {
				return usageError{fmt.Errorf("--tail %d: give 1 to 1000", q.Limit)}
			}
			if since != "" {
				if q.Since, err = parseSince(since, a.now()); err != nil {
					return usageError{err}
				}
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			print := func(e wire.SandboxLogEntry) error {
				if asJSON {
					return json.NewEncoder(a.stdout).Encode(e)
				}
				_, err := io.WriteString(a.stdout, formatLogEntry(e)+"\n")
				return err
			}
			// The newest entries since --since: backward from now.
			first := q
			first.Backward, first.Since = true, time.Time{}
			entries, err := c.SandboxLog(cmd.Context(), argv[0], first)
			if err != nil {
				return err
			}
			seen := logCursor{last: q.Since}
			for _, e := range seen.fresh(entries) {
				if err := print(e); err != nil {
					return err
				}
			}
			if !follow {
				return nil
			}
			return followLog(cmd.Context(), c, argv[0], q, &seen, print, a.stderr, logsPollInterval)
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	fl := cmd.Flags()
	fl.IntVarP(&q.Limit, "tail", "n", 1000, "print the newest N entries (1 to 1000)")
	fl.StringVar(&q.Level, "level", "", "only entries at this level or above: debug, info, warn or error")
	fl.StringVar(&q.Search, "search", "", "only entries whose message contains this (case-sensitive)")
	fl.StringVar(&since, "since", "", "only entries since this long ago (30m, 12h) or this RFC 3339 time")
	fl.BoolVarP(&follow, "follow", "f", false, "keep printing new entries until the sandbox ends (or Ctrl-C)")
	return cmd
}

// followLog polls for entries after seen's until ctx ends or the sandbox
// is gone (or dead). An error the server may get over (503, 502, a
// timeout) is retried at the next poll.
func followLog(ctx context.Context, c *client.Client, id string, q client.LogQuery, seen *logCursor,
	print func(wire.SandboxLogEntry) error, stderr io.Writer, every time.Duration) error {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		// Whole pages whatever --tail was: a page of only entries printed
		// already must not be all a poll sees.
		next := q
		next.Backward, next.Since, next.Limit = false, seen.last, maxLogPage
		entries, err := c.SandboxLog(ctx, id, next)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, errdefs.ErrNotFound):
			return nil // the sandbox ended
		case errors.Is(err, errdefs.ErrUnavailable), errors.Is(err, errdefs.ErrBadGateway), errors.Is(err, context.DeadlineExceeded):
			continue
		case err != nil:
			return err
		}
		fresh := seen.fresh(entries)
		if len(fresh) == 0 && len(entries) == maxLogPage {
			// More than a page in the cursor's millisecond, all printed:
			// step past it rather than ask for the same page forever.
			fmt.Fprintf(stderr, "aenv logs: more than %d entries at %s; the rest of that millisecond is skipped\n",
				maxLogPage, seen.last.Format(time.RFC3339Nano))
			seen.last, seen.atLast = seen.last.Truncate(time.Millisecond).Add(time.Millisecond), 0
		}
		for _, e := range fresh {
			if err := print(e); err != nil {
				return err
			}
		}
		if len(fresh) == 0 && ended(ctx, c, id) {
			return nil
		}
	}
}

// ended says whether sandbox id is dead or gone: a dead sandbox's record
// stays a while, and its log then is empty.
func ended(ctx context.Context, c *client.Client, id string) bool {
	sb, err := c.GetSandbox(ctx, id)
	return errors.Is(err, errdefs.ErrNotFound) || (err == nil && sb.State == "dead")
}

// logCursor remembers the newest entry printed. The server's cursor is in
// milliseconds and inclusive, so an answer repeats the entries of the last
// millisecond printed: they are skipped by count.
type logCursor struct {
	last   time.Time
	atLast int // entries printed with timestamp last
}

// fresh returns the entries of an answer from the cursor that were not
// printed yet, and moves the cursor past them.
func (c *logCursor) fresh(entries []wire.SandboxLogEntry) []wire.SandboxLogEntry {
	from, skip := c.last, c.atLast
	var out []wire.SandboxLogEntry
	for _, e := range entries {
		if e.Timestamp.Before(from) {
			continue
		}
		if e.Timestamp.Equal(from) && skip > 0 {
			skip--
			continue
		}
		c.advance(e)
		out = append(out, e)
	}
	return out
}

func (c *logCursor) advance(e wire.SandboxLogEntry) {
	if e.Timestamp.Equal(c.last) {
		c.atLast++
		return
	}
	c.last, c.atLast = e.Timestamp, 1
}

// quoteControl quotes s if it holds control characters: what a process in
// the sandbox wrote must not move the reader's terminal.
func quoteControl(s string) string {
	if hasControl(s) {
		return strconv.Quote(s)
	}
	return s
}

func hasControl(s string) bool { return strings.ContainsFunc(s, unicode.IsControl) }

// formatLogEntry is one line: time, level, message and the fields by name.
func formatLogEntry(e wire.SandboxLogEntry) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %-5s %s", e.Timestamp.Local().Format("2006-01-02 15:04:05.000"), strings.ToUpper(string(e.Level)),
		quoteControl(e.Message))
	keys := make([]string, 0, len(e.Fields))
	for k := range e.Fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := e.Fields[k]
		if v == "" || strings.ContainsAny(v, " \"=") || hasControl(v) {
			v = strconv.Quote(v)
		}
		fmt.Fprintf(&b, " %s=%s", quoteControl(k), v)
	}
	return b.String()
}
