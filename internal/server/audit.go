package server

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/aenv-dev/aenv/internal/audit"
	"github.com/aenv-dev/aenv/internal/config"
)

// openAudit starts the audit log over store as cfg says; close stops it
// and closes its file.
func openAudit(cfg config.Audit, store audit.Store, logger *slog.Logger) (log *audit.Log, close func(), err error) {
	opts := audit.Options{Retention: time.Duration(cfg.RetentionDays) * 24 * time.Hour}
	var file *os.File
	if cfg.File != "" {
		file, err = os.OpenFile(cfg.File, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return nil, nil, fmt.Errorf("--audit-file: %w", err)
		}
		opts.File = file
	}
	log = audit.New(store, opts, logger.With("component", "audit"))
	return log, func() {
		log.Close()
		if file != nil {
			file.Close()
		}
	}, nil
}
