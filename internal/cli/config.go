package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

// DefaultURL is the server the client talks to when nothing says otherwise.
const DefaultURL = "http://localhost:8000"

// Environment variables of the client. AENV_API_KEY is also the server's
// key variable, so one setting serves both on a single machine.
const (
	envURL    = "AENV_URL"
	envAPIKey = "AENV_API_KEY"
	envConfig = "AENV_CONFIG"
)

// clientConfig is what `aenv auth` saves.
type clientConfig struct {
	URL    string `json:"url"`
	APIKey string `json:"apiKey"`
}

// configPath is $AENV_CONFIG, else $XDG_CONFIG_HOME/aenv/config.json, else
// ~/.config/aenv/config.json.
func configPath(getenv func(string) string) (string, error) {
	if p := getenv(envConfig); p != "" {
		return p, nil
	}
	if dir := getenv("XDG_CONFIG_HOME"); dir != "" {
		return filepath.Join(dir, "aenv", "config.json"), nil
	}
	home := getenv("HOME")
	if home == "" {
		return "", errors.New("cannot locate the config file: HOME is not set (set AENV_CONFIG)")
	}
	return filepath.Join(home, ".config", "aenv", "config.json"), nil
}

// loadConfig reads the saved config; a missing file is an empty config.
func loadConfig(path string) (clientConfig, error) {
	var cfg clientConfig
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return cfg, nil
	}
	if err != nil {
		return cfg, fmt.Errorf("read config: %w", err)
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return cfg, fmt.Errorf("read config %s: %w", path, err)
	}
	return cfg, nil
}

// saveConfig writes cfg readable by the owner only; the API key is a secret.
func saveConfig(path string, cfg clientConfig) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("save config: %w", err)
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return fmt.Errorf("save config: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".config-*.json")
	if err != nil {
		return fmt.Errorf("save config: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("save config: %w", err)
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("save config: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save config: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("save config: %w", err)
	}
	return nil
}

// serverFlags are --url and --api-key, on every command that talks to a
// server.
type serverFlags struct {
	url    string
	apiKey string
}

func addServerFlags(cmd *cobra.Command, f *serverFlags) {
	cmd.Flags().StringVar(&f.url, "url", "", "server URL (default: $"+envURL+", the saved config, else "+DefaultURL+")")
	cmd.Flags().StringVar(&f.apiKey, "api-key", "", "API key (default: $"+envAPIKey+", else the saved config)")
}

// resolve picks the URL and key. Precedence: flags, environment, saved
// config, default URL.
func (f serverFlags) resolve(getenv func(string) string) (clientConfig, error) {
	path, err := configPath(getenv)
	if err != nil {
		return clientConfig{}, err
	}
	saved, err := loadConfig(path)
	if err != nil {
		return clientConfig{}, err
	}
	cfg := clientConfig{
		URL:    firstNonEmpty(f.url, getenv(envURL), saved.URL, DefaultURL),
		APIKey: firstNonEmpty(f.apiKey, getenv(envAPIKey), saved.APIKey),
	}
	cfg.URL = strings.TrimRight(cfg.URL, "/")
	if cfg.APIKey == "" {
		return cfg, authError{errors.New("no API key: run `aenv auth`, or set " + envAPIKey + " or --api-key")}
	}
	return cfg, nil
}

func firstNonEmpty(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}
