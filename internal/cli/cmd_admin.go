package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/backup"
	"github.com/aenv-dev/aenv/internal/config"
	"github.com/aenv-dev/aenv/internal/errdefs"
)

// newAdminCommand groups the commands an operator runs on a node's
// machine, against its data dir rather than through the API.
func newAdminCommand(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "admin",
		Short: "Operate a node's data dir: backup and restore",
		Long: `Commands run as root on a node's machine, on its data dir (--data-dir, as the
server's) rather than through the API.

A single node keeps its state in its data dir: the SQLite database and the
files its records name (template root filesystems, snapshot and paused
sandbox images). "aenv admin backup" archives them while the server runs;
"aenv admin restore" unpacks an archive into an empty data dir for a server
to start on. A cluster's records are in PostgreSQL: see docs/operations.md.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newBackupCommand(stdout, stderr), newRestoreCommand(stderr))
	return cmd
}

func dataDirFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "data-dir", envOr("data-dir", config.Default().DataDir),
		"the node's data dir, as the server's --data-dir (env "+config.EnvName("data-dir")+")")
}

func newBackupCommand(stdout, stderr io.Writer) *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{
		Use:   "backup FILE",
		Short: "Archive a single node's data dir, while its server runs",
		Long: `Write a backup of a single node's data dir to FILE ("-": standard output), a
zstd-compressed tar, readable by root only (it holds the API key, the CA's key
and sandboxes' memory).

It holds a consistent copy of the database, taken while the server writes
(SQLite's VACUUM INTO), the template root filesystems, snapshot images and
images of sandboxes paused to disk that its records name (those in
--template-cache-dir too), the API key, the TLS CA and build records. It
leaves out what a start makes again: the runtime state of running sandboxes,
image layers, object-store downloads and build uploads.

Running sandboxes and those paused in memory have no image to hold: they are
named on standard error and come back dead. Pause them to disk first
(POST /sandboxes/{id}/pause with {"toDisk": true}) to keep them.`,
		Example: `  sudo aenv admin backup /backups/aenv-$(date +%F).tar.zst
  sudo aenv admin backup - --data-dir /srv/aenv | ssh backup-host 'cat > aenv.tar.zst'`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			start := time.Now()
			if inside(argv[0], dataDir) {
				return usageError{fmt.Errorf("the backup file %s is inside the data dir %s: it would be archived into itself", argv[0], dataDir)}
			}
			warn := func(msg string) { fmt.Fprintln(stderr, "warning:", msg) }
			var sum backup.Summary
			err := writeAtomically(argv[0], stdout, func(w io.Writer, tmpDir string) error {
				var err error
				sum, err = backup.Create(cmd.Context(), w, backup.Options{DataDir: dataDir, Version: Version,
					TempDir: tmpDir, Warn: warn})
				return err
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(stderr, "backed up %s: %d templates and snapshots, %d sandboxes paused to disk, %s of files%s (took %s)\n",
				dataDir, sum.Templates, sum.Paused, mib(sum.Bytes), externalNote(sum.External),
				time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	dataDirFlag(cmd, &dataDir)
	return cmd
}

// inside reports whether path is dir or under it ("-" never is).
func inside(path, dir string) bool {
	if path == "-" {
		return false
	}
	p, err1 := filepath.Abs(path)
	d, err2 := filepath.Abs(dir)
	if err1 != nil || err2 != nil {
		return false
	}
	rel, err := filepath.Rel(d, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

func externalNote(roots []string) string {
	if len(roots) == 0 {
		return ""
	}
	return ", with " + strings.Join(roots, ", ")
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// writeAtomically runs write into a temporary file beside path, renamed
// to path once whole, so that a cut backup never looks like one; "-"
// writes to stdout. tmpDir is a directory for write's own scratch.
func writeAtomically(path string, stdout io.Writer, write func(w io.Writer, tmpDir string) error) error {
	if path == "-" {
		return write(stdout, "")
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".partial-*")
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	tmp := f.Name()
	err = f.Chmod(0o600)
	if err == nil {
		err = write(f, dir)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

func newRestoreCommand(stderr io.Writer) *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{
		Use:   "restore FILE",
		Short: "Unpack a backup into an empty data dir",
		Long: `Unpack the backup FILE ("-": standard input), made by "aenv admin backup", into
the data dir --data-dir, which must be empty or not exist: a restore never
merges into or replaces a data dir.

The archive is unpacked beside and checked whole (its trailer and checksum)
before anything is moved into place: a cut or damaged backup is refused and
leaves nothing. Records naming files of the old data dir are rewritten to the
new one. Root filesystems from outside the data dir (--template-cache-dir) go
back where they were when they are missing; one already there is kept.

Then start a server with --data-dir on it: templates, snapshots and sandboxes
paused to disk are back; resume them as before.`,
		Example: `  sudo aenv admin restore /backups/aenv-2026-01-31.tar.zst --data-dir /var/lib/aenv
  sudo systemctl start aenv`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			start := time.Now()
			var r io.Reader = cmd.InOrStdin()
			if argv[0] != "-" {
				f, err := os.Open(argv[0])
				if errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("backup file %s does not exist: %w", argv[0], errdefs.ErrNotFound)
				}
				if err != nil {
					return fmt.Errorf("backup: %w", err)
				}
				defer f.Close()
				r = f
			}
			sum, err := backup.Restore(cmd.Context(), r, dataDir)
			if err != nil {
				return err
			}
			fmt.Fprintf(stderr, "restored the backup of %s into %s: %d entries, %s of files (took %s)\n",
				sum.From, dataDir, sum.Entries, mib(sum.Bytes), time.Since(start).Round(time.Millisecond))
			for _, p := range sum.External {
				fmt.Fprintf(stderr, "put back %s\n", p)
			}
			for _, p := range sum.Kept {
				fmt.Fprintf(stderr, "kept %s, already on this machine\n", p)
			}
			return nil
		},
	}
	dataDirFlag(cmd, &dataDir)
	return cmd
}
