package config

import (
	"fmt"

	"github.com/spf13/pflag"
)

// Audit configures the audit log of a server or gateway (internal/audit):
// it is always kept in the database; File copies it as JSON lines.
type Audit struct {
	File          string
	RetentionDays int
}

// DefaultAudit keeps 90 days of events.
func DefaultAudit() Audit { return Audit{RetentionDays: 90} }

func (a *Audit) register(fs *pflag.FlagSet) {
	fs.StringVar(&a.File, "audit-file", envString("audit-file", a.File),
		"also append each audit event (who changed what, when, from where, with what answer) to this file as a JSON line, for a log shipper (empty: the database only); a cluster's gateways keep its audit log, its nodes none"+envHint("audit-file"))
	fs.IntVar(&a.RetentionDays, "audit-retention-days", envInt("audit-retention-days", a.RetentionDays),
		"days audit events are kept in the database (0: for ever); the file is the log shipper's to rotate"+envHint("audit-retention-days"))
}

func (a Audit) validate() error {
	if a.RetentionDays < 0 {
		return fmt.Errorf("--audit-retention-days must be 0 (for ever) or more, got %d", a.RetentionDays)
	}
	return nil
}
