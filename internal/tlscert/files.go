package tlscert

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// fileCert serves the certificate of a pair of files, reloading it when
// either file changes: an operator's renewal (certbot, lego) replaces the
// files and the next handshakes use the new certificate, with no restart.
type fileCert struct {
	certFile, keyFile string
	interval          time.Duration
	logger            *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	seen    [2]os.FileInfo // of certFile and keyFile when cert was loaded
	checked time.Time
}

// loadFileCert loads the pair, refusing one that does not parse or whose
// key is not the certificate's.
func loadFileCert(certFile, keyFile string, interval time.Duration, logger *slog.Logger) (*fileCert, error) {
	f := &fileCert{certFile: certFile, keyFile: keyFile, interval: interval, logger: logger}
	seen, err := f.stat()
	if err != nil {
		return nil, err
	}
	cert, err := loadPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	f.cert, f.seen, f.checked = cert, seen, time.Now()
	return f, nil
}

func loadPair(certFile, keyFile string) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s and --tls-key %s: %w", certFile, keyFile, err)
	}
	return &cert, nil
}

func (f *fileCert) stat() ([2]os.FileInfo, error) {
	var out [2]os.FileInfo
	for i, p := range []string{f.certFile, f.keyFile} {
		fi, err := os.Stat(p) // through symlinks: certbot's live/ names link to archive/
		if err != nil {
			return out, fmt.Errorf("TLS certificate: %w", err)
		}
		out[i] = fi
	}
	return out, nil
}

// GetCertificate is the listener's tls.Config.GetCertificate: the files
// are looked at no more often than f.interval.
func (f *fileCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.checked) >= f.interval {
		f.checked = time.Now()
		f.reloadLocked()
	}
	return f.cert, nil
}

// reloadLocked loads the files again when either changed. A pair that
// does not load (a renewal half written: the new certificate beside the
// old key) keeps the current certificate, and is tried again at the next
// check.
func (f *fileCert) reloadLocked() {
	seen, err := f.stat()
	if err != nil {
		f.logger.Warn("TLS certificate files unreadable; serving the one loaded before", "err", err)
		return
	}
	if unchanged(f.seen[0], seen[0]) && unchanged(f.seen[1], seen[1]) {
		return
	}
	cert, err := loadPair(f.certFile, f.keyFile)
	if err != nil {
		f.logger.Warn("TLS certificate files changed but do not load; serving the one loaded before", "err", err)
		return
	}
	f.cert, f.seen = cert, seen
	f.logger.Info("TLS certificate reloaded", "file", f.certFile, "serial", cert.Leaf.SerialNumber.Text(16),
		"not_after", cert.Leaf.NotAfter)
}

func unchanged(a, b os.FileInfo) bool {
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size()
}
