package envd

import (
	"fmt"
	"os/exec"
	"syscall"
)

// PrepareKernel makes cmd run as a process envd would start for a request
// naming no user: as the default user, with the sandbox's env vars (plus
// extra), in cwd (relative to the user's home; "" means the default
// workdir). The code interpreter starts its kernels with it.
func (s *Server) PrepareKernel(cmd *exec.Cmd, cwd string, extra map[string]string) error {
	user, err := s.userByName("")
	if err != nil {
		return fmt.Errorf("kernel user: %w", err)
	}
	dir, err := s.processCwd(user, cwd)
	if err != nil {
		return err
	}
	cmd.Env = processEnv(user, s.settings.env(), extra)
	cmd.Dir = dir
	// Its own process group, so that an interrupt reaches the kernel alone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: credentialFor(user)}
	return nil
}

// Env is the sandbox's env vars as /init last set them: a restored
// sandbox's kernels, started before, learn them at their next execution.
func (s *Server) Env() map[string]string {
	return s.settings.env()
}

// AccessToken is the token /init configured ("" when there is none).
func (s *Server) AccessToken() string {
	return s.settings.token()
}
