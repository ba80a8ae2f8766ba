package envd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	pb "github.com/aenv-dev/aenv/api/envd/process"
	"github.com/creack/pty"
)

// defaultPath is the PATH a process gets before sandbox and request envs.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// errBadCwd marks a working directory that does not exist.
var errBadCwd = errors.New("invalid working directory")

// processEnv builds the child environment in upstream's order: the user's
// basics, then the sandbox env vars from /init, then the request envs.
// Later values win.
func processEnv(user account, sandbox, request map[string]string) []string {
	env := map[string]string{
		"PATH":    defaultPath,
		"HOME":    user.Home,
		"USER":    user.Name,
		"LOGNAME": user.Name,
	}
	for k, v := range sandbox {
		env[k] = v
	}
	for k, v := range request {
		env[k] = v
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+env[k])
	}
	return out
}

// processCwd picks the working directory: the request's (relative to home),
// else the default workdir, else home. It must exist.
func (s *Server) processCwd(user account, requested string) (string, error) {
	dir := requested
	if dir == "" {
		dir = s.settings.workdir()
	}
	if dir == "" {
		dir = user.Home
	}
	dir, err := resolvePath(dir, user)
	if err != nil {
		return "", err
	}
	info, err := os.Stat(dir)
	if err != nil {
		return "", fmt.Errorf("cwd %s: %w: %w", dir, errBadCwd, err)
	}
	if !info.IsDir() {
		return "", fmt.Errorf("cwd %s is not a directory: %w", dir, errBadCwd)
	}
	return dir, nil
}

// lookPathIn resolves a bare command name against the child's PATH rather
// than envd's own.
func lookPathIn(name string, env []string) string {
	if strings.Contains(name, "/") {
		return name
	}
	pathList := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathList = v
		}
	}
	for _, dir := range filepath.SplitList(pathList) {
		candidate := filepath.Join(dir, name)
		info, err := os.Stat(candidate)
		if err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0 {
			return candidate
		}
	}
	return name
}

// credentialFor returns the credential to run as user, or nil when envd
// already is that user: switching (setgroups included) needs CAP_SETUID and
// CAP_SETGID, which a sandbox may not grant when no switch is needed.
func credentialFor(user account) *syscall.Credential {
	if uint32(os.Getuid()) == user.UID && uint32(os.Getgid()) == user.GID {
		return nil
	}
	return &syscall.Credential{Uid: user.UID, Gid: user.GID, Groups: user.Groups}
}

// spawn starts the process described by req as user. Output goes to pipes
// (or a PTY) whose read ends are returned in p.outs.
func (s *Server) spawn(req *pb.StartRequest, user account) (*process, error) {
	cfg := req.GetProcess()
	if cfg.GetCmd() == "" {
		return nil, fmt.Errorf("start: %w", fs.ErrInvalid)
	}
	cwd, err := s.processCwd(user, cfg.GetCwd())
	if err != nil {
		return nil, err
	}
	env := processEnv(user, s.settings.env(), cfg.GetEnvs())
	cmd := exec.Command(lookPathIn(cfg.GetCmd(), env), cfg.GetArgs()...)
	cmd.Args[0] = cfg.GetCmd()
	cmd.Env = env
	cmd.Dir = cwd
	p := &process{
		info:   &pb.ProcessInfo{Config: cfg, Tag: req.Tag},
		cmd:    cmd,
		exited: make(chan struct{}),
		subs:   map[*subscriber]struct{}{},
	}
	if req.GetPty() != nil {
		err = startWithPTY(s.children, p, req.GetPty(), user)
	} else {
		err = startWithPipes(s.children, p, req.GetStdin(), user)
	}
	if err != nil {
		return nil, err
	}
	p.pid = uint32(cmd.Process.Pid)
	p.info.Pid = p.pid
	return p, nil
}

func startWithPTY(children *Reaper, p *process, size *pb.PTY, user account) error {
	attrs := &syscall.SysProcAttr{Setsid: true, Setctty: true, Credential: credentialFor(user)}
	ws := &pty.Winsize{Cols: uint16(size.GetSize().GetCols()), Rows: uint16(size.GetSize().GetRows())}
	if ws.Cols == 0 || ws.Rows == 0 {
		ws = &pty.Winsize{Cols: 80, Rows: 24}
	}
	var master *os.File
	err := children.Start(p.cmd, func() (err error) {
		master, err = pty.StartWithAttrs(p.cmd, ws, attrs)
		return err
	})
	if err != nil {
		return fmt.Errorf("start with pty: %w", err)
	}
	p.pty = master
	p.outs = []*os.File{master}
	return nil
}

func startWithPipes(children *Reaper, p *process, wantStdin bool, user account) error {
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: credentialFor(user)}
	if wantStdin {
		w, err := p.cmd.StdinPipe()
		if err != nil {
			return fmt.Errorf("stdin pipe: %w", err)
		}
		p.stdin = w
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return fmt.Errorf("stderr pipe: %w", err)
	}
	p.cmd.Stdout, p.cmd.Stderr = outW, errW
	err = children.Start(p.cmd, p.cmd.Start)
	// The child holds its own copies of the write ends; ours must go so
	// that readers see EOF when the child's side closes.
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		if p.stdin != nil {
			p.stdin.Close()
		}
		return fmt.Errorf("start: %w", err)
	}
	p.outs = []*os.File{outR, errR}
	return nil
}
