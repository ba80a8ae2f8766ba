package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/config"
	"github.com/aenv-dev/aenv/internal/tlscert"
)

// caDirFlags name the lab CA's directory: --tls-ca-dir, else
// <--data-dir>/tls, as the server finds it.
type caDirFlags struct {
	dataDir, caDir string
}

func (f *caDirFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.dataDir, "data-dir", envOr("data-dir", config.Default().DataDir),
		"data dir of the server keeping the CA in <data-dir>/tls (env "+config.EnvName("data-dir")+")")
	fs.StringVar(&f.caDir, "tls-ca-dir", envOr("tls-ca-dir", ""),
		"directory of the CA, as the server's or gateway's --tls-ca-dir (wins over --data-dir; env "+config.EnvName("tls-ca-dir")+")")
}

func (f *caDirFlags) dir() string {
	if f.caDir != "" {
		return f.caDir
	}
	return config.DefaultCADir(f.dataDir)
}

func envOr(flag, def string) string {
	if v, ok := os.LookupEnv(config.EnvName(flag)); ok {
		return v
	}
	return def
}

func newCACommand(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ca",
		Short: "The lab CA that signs the HTTPS listener's certificate",
		Long: `A server, node or gateway started with --tls-listen and no --tls-cert or
--acme-directory serves HTTPS with a certificate signed by its lab CA, kept in
<data-dir>/tls (or --tls-ca-dir). Clients must trust the CA's certificate:

  aenv ca export > aenv-ca.pem
  NODE_EXTRA_CA_CERTS=$PWD/aenv-ca.pem node app.js     # E2B's JS SDK
  curl --cacert aenv-ca.pem https://api.<domain>/health

Python clients, E2B's included: see docs/tls.md.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newCAExportCommand(stdout), newCAInitCommand(stderr))
	return cmd
}

func newCAExportCommand(stdout io.Writer) *cobra.Command {
	var f caDirFlags
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Print the lab CA's certificate (PEM) for clients to trust",
		Long: `Print the lab CA's certificate (PEM): what clients add to their trusted roots
(NODE_EXTRA_CA_CERTS, SSL_CERT_FILE, REQUESTS_CA_BUNDLE, curl --cacert, or
/usr/local/share/ca-certificates/ and update-ca-certificates). The key is never
printed.`,
		Example: `  sudo aenv ca export > aenv-ca.pem
  aenv ca export --tls-ca-dir /etc/aenv/ca > aenv-ca.pem`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			pem, err := tlscert.ReadCACert(f.dir())
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("no lab CA in %s: a server makes it at its first start with --tls-listen, "+
					"or run `aenv ca init`", f.dir())
			}
			if err != nil {
				return err
			}
			_, err = stdout.Write(pem)
			return err
		},
	}
	f.register(cmd)
	return cmd
}

func newCAInitCommand(stderr io.Writer) *cobra.Command {
	var f caDirFlags
	var domain string
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Make the lab CA ahead of the first start (kept if there is one)",
		Long: `Make the lab CA in its directory ahead of a server's first start, e.g. one
directory shared by several gateways (--tls-ca-dir). A CA already there is kept.
The CA may sign names under --domain, localhost and loopback addresses only
(X.509 name constraints): give the servers' --domain.`,
		Example: `  aenv ca init --tls-ca-dir /etc/aenv/ca --domain sandboxes.example.com`,
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ca, created, err := tlscert.LoadOrCreateCA(f.dir(), domain)
			if err != nil {
				return err
			}
			what := "kept the lab CA already"
			if created {
				what = "made a lab CA"
			}
			fmt.Fprintf(stderr, "%s in %s (%s, valid until %s, for %v)\n", what, f.dir(), ca.Cert.Subject.CommonName,
				ca.Cert.NotAfter.Format("2006-01-02"), ca.Cert.PermittedDNSDomains)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&domain, "domain", envOr("domain", config.Default().Domain),
		"the servers' --domain: the CA signs names under it (env "+config.EnvName("domain")+")")
	return cmd
}
