package envd

import (
	"maps"
	"sync"
)

// settings holds what POST /init configured: the sandbox's token, env
// vars, default user and working directory. The server calls /init on
// every create, resume and fork, so all of it can change while envd runs.
type settings struct {
	mu             sync.RWMutex
	accessToken    string
	envVars        map[string]string
	defaultUser    string
	defaultWorkdir string
}

// initRequest is the body of POST /init. Upstream fields we do not use
// (volume mounts, hyperloop IP, timestamps, CA bundles) are ignored.
type initRequest struct {
	AccessToken    *string           `json:"accessToken"`
	EnvVars        map[string]string `json:"envVars"`
	DefaultUser    *string           `json:"defaultUser"`
	DefaultWorkdir *string           `json:"defaultWorkdir"`
	// Nameservers, when set, become /etc/resolv.conf: the resolvers the
	// sandbox's egress policy lets through (an aenv extension).
	Nameservers []string `json:"nameservers"`
	// KillProcesses ends every process but envd itself: a sandbox resumed
	// without its memory keeps its files, not its processes (an aenv
	// extension, for E2B's keepMemory: false).
	KillProcesses bool `json:"killProcesses"`
	// Reseed: the sandbox is new, restored from a template's image that
	// other sandboxes are restored from too; state that must differ
	// between them (the code interpreter's random generators) is made
	// anew (an aenv extension).
	Reseed bool `json:"reseed"`
}

// newSettings starts with no token or env vars, and defaultUser (else
// root) as the default user.
func newSettings(defaultUser string) *settings {
	if defaultUser == "" {
		defaultUser = "root"
	}
	return &settings{envVars: map[string]string{}, defaultUser: defaultUser}
}

// apply makes req's changes at once (initMu orders /init's callers).
func (s *settings) apply(req initRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.AccessToken != nil {
		s.accessToken = *req.AccessToken
	}
	maps.Copy(s.envVars, req.EnvVars)
	if req.DefaultUser != nil && *req.DefaultUser != "" {
		s.defaultUser = *req.DefaultUser
	}
	if req.DefaultWorkdir != nil {
		s.defaultWorkdir = *req.DefaultWorkdir
	}
}

func (s *settings) token() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.accessToken
}

func (s *settings) env() map[string]string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return maps.Clone(s.envVars)
}

func (s *settings) user() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.defaultUser
}

func (s *settings) workdir() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.defaultWorkdir
}
