package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/aenv-dev/aenv/internal/client"
)

func (a *app) authCommand() *cobra.Command {
	var f serverFlags
	var noVerify bool
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Save the server URL and API key for later commands",
		Long: `Ask for the server URL and API key, check them against the server, and save
them to ~/.config/aenv/config.json (mode 0600; $AENV_CONFIG or
$XDG_CONFIG_HOME move it). --url and --api-key answer the questions without
asking. Later commands read, highest first: their --url/--api-key flags, the
AENV_URL/AENV_API_KEY environment variables, this file.

A key the server rejects is not saved (exit 4). An unreachable server is
reported, but the settings are saved anyway.`,
		Example: `  aenv auth
  aenv auth --url http://127.0.0.1:8000 --api-key "$(sudo cat /var/lib/aenv/api-key)"`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runAuth(cmd.Context(), f, noVerify)
		},
	}
	addServerFlags(cmd, &f)
	cmd.Flags().BoolVar(&noVerify, "no-verify", false, "save without checking the key against the server")
	return cmd
}

func (a *app) runAuth(ctx context.Context, f serverFlags, noVerify bool) error {
	path, err := configPath(a.getenv)
	if err != nil {
		return err
	}
	saved, err := loadConfig(path)
	if err != nil {
		return err
	}
	in := bufio.NewReader(a.stdin)
	cfg := clientConfig{URL: f.url, APIKey: f.apiKey}
	if cfg.URL == "" {
		def := firstNonEmpty(saved.URL, DefaultURL)
		fmt.Fprintf(a.stderr, "AENV server URL [%s]: ", def)
		line, err := readLine(in)
		if err != nil {
			return fmt.Errorf("read URL: %w", err)
		}
		cfg.URL = firstNonEmpty(line, def)
	}
	if err := checkURL(cfg.URL); err != nil {
		return err
	}
	cfg.URL = strings.TrimRight(cfg.URL, "/")
	if cfg.APIKey == "" {
		if cfg.APIKey, err = a.promptKey(in, saved.APIKey); err != nil {
			return err
		}
	}
	if !noVerify {
		if err := a.verify(ctx, cfg); err != nil {
			var unreachable *client.UnreachableError
			if !errors.As(err, &unreachable) {
				return err
			}
			fmt.Fprintf(a.stderr, "warning: %s\n", describe(err))
		}
	}
	if err := saveConfig(path, cfg); err != nil {
		return err
	}
	fmt.Fprintf(a.stderr, "Saved %s (server %s)\n", path, cfg.URL)
	return nil
}

// promptKey reads the key without echo on a terminal. An empty answer keeps
// the saved key.
func (a *app) promptKey(in *bufio.Reader, saved string) (string, error) {
	if saved != "" {
		fmt.Fprintf(a.stderr, "API key [keep the saved one]: ")
	} else {
		fmt.Fprintf(a.stderr, "API key: ")
	}
	var key string
	if fd, ok := terminalFd(a.stdin); ok {
		b, err := term.ReadPassword(fd)
		fmt.Fprintln(a.stderr)
		if err != nil {
			return "", fmt.Errorf("read API key: %w", err)
		}
		key = strings.TrimSpace(string(b))
	} else {
		line, err := readLine(in)
		if err != nil {
			return "", fmt.Errorf("read API key: %w", err)
		}
		key = line
	}
	key = firstNonEmpty(key, saved)
	if key == "" {
		return "", usageError{errors.New("an API key is required (the server prints it on first start and keeps it in <data-dir>/api-key)")}
	}
	return key, nil
}

// readLine reads one trimmed line; EOF after some text is fine.
func readLine(in *bufio.Reader) (string, error) {
	line, err := in.ReadString('\n')
	if err != nil && !(errors.Is(err, io.EOF) && line != "") {
		if errors.Is(err, io.EOF) {
			return "", nil
		}
		return "", err
	}
	return strings.TrimSpace(line), nil
}

func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usageError{fmt.Errorf("server URL %q must look like http://host:port", raw)}
	}
	return nil
}

// verify makes one authenticated request.
func (a *app) verify(ctx context.Context, cfg clientConfig) error {
	_, err := a.clientFor(cfg).DoJSON(ctx, http.MethodGet, "/v2/sandboxes", url.Values{"limit": {"1"}}, nil, nil)
	return err
}
