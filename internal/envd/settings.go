package envd

import (
	"maps"
	"sync"
)

// State is what POST /init configured: the sandbox's token, env vars,
// default user and working directory.
type State struct {
	AccessToken    string            `json:"accessToken,omitempty"`
	EnvVars        map[string]string `json:"envVars,omitempty"`
	DefaultUser    string            `json:"defaultUser,omitempty"`
	DefaultWorkdir string            `json:"defaultWorkdir,omitempty"`
}

// settings holds the current State. The server calls /init on every create,
// resume and fork, so all of it can change while envd runs.
type settings struct {
	mu    sync.RWMutex
	state State
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
	st := State{EnvVars: map[string]string{}, DefaultUser: defaultUser}
	if st.DefaultUser == "" {
		st.DefaultUser = "root"
	}
	return &settings{state: st}
}

func cloneState(st State) State {
	st.EnvVars = maps.Clone(st.EnvVars)
	return st
}

// next returns the State that applying req would produce, leaving the
// current one untouched.
func (s *settings) next(req initRequest) State {
	s.mu.RLock()
	st := cloneState(s.state)
	s.mu.RUnlock()
	if req.AccessToken != nil {
		st.AccessToken = *req.AccessToken
	}
	if st.EnvVars == nil {
		st.EnvVars = map[string]string{}
	}
	maps.Copy(st.EnvVars, req.EnvVars)
	if req.DefaultUser != nil && *req.DefaultUser != "" {
		st.DefaultUser = *req.DefaultUser
	}
	if req.DefaultWorkdir != nil {
		st.DefaultWorkdir = *req.DefaultWorkdir
	}
	return st
}

func (s *settings) set(st State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state = st
}

// apply makes req's changes the current State (initMu orders callers).
func (s *settings) apply(req initRequest) {
	s.set(s.next(req))
}

func (s *settings) token() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.state.AccessToken
}

func (s *settings) env() map[string]string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return maps.Clone(s.state.EnvVars)
}

func (s *settings) user() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.state.DefaultUser
}

func (s *settings) workdir() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.state.DefaultWorkdir
}
