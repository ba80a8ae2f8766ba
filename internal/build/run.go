package build

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
	"github.com/aenv-dev/aenv/internal/node"
	"github.com/aenv-dev/aenv/internal/store"
	"github.com/aenv-dev/aenv/internal/template"
)

// Step names in logs and failure reasons, as the SDK reads them: "base",
// the 1-based index of a step, or "finalize" (start and ready commands,
// the snapshot).
const (
	stepBase     = "base"
	stepFinalize = "finalize"
)

// maxStepLogBytes bounds the output of one step kept in the log.
const maxStepLogBytes = 1 << 20

// stepError is a failure the user caused or can fix, told in the build's
// status; other errors are reported as internal.
type stepError struct {
	step string
	msg  string
}

func (e *stepError) Error() string { return e.msg }

func failStep(step, format string, args ...any) error {
	return &stepError{step: step, msg: fmt.Sprintf(format, args...)}
}

// run is one build from the wait for its template's lock to its end.
func (s *Service) run(b *build, spec Spec, base Base) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.BuildTimeout)
	defer cancel()
	log := s.logger.With("template", b.templateID, "build", b.id)
	unlock, err := s.lock(ctx, b.templateID)
	if err != nil {
		b.setStatus(StatusError, &Reason{Message: "build canceled while waiting for another build of the template"})
		return
	}
	defer unlock()
	b.setStatus(StatusBuilding, nil)
	began := time.Now()
	s.metrics.running.Inc()
	err = s.execute(ctx, b, spec, base)
	s.metrics.running.Dec()
	s.metrics.duration.Observe(time.Since(began).Seconds())
	if err == nil {
		s.metrics.finished.WithLabelValues(StatusReady).Inc()
		b.log("info", stepFinalize, fmt.Sprintf("Build finished in %s", time.Since(began).Round(time.Millisecond)))
		b.setStatus(StatusReady, nil)
		log.InfoContext(ctx, "template built", "took", time.Since(began).Round(time.Millisecond))
		return
	}
	s.metrics.finished.WithLabelValues(StatusError).Inc()
	var se *stepError
	if !errors.As(err, &se) {
		log.ErrorContext(ctx, "template build failed", "err", err)
		msg := "internal error"
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			msg = "build timed out"
		case errors.Is(err, context.Canceled):
			msg = "build canceled: the server is stopping"
		case errors.Is(err, store.ErrUnavailable):
			// The database's own text names hosts and sockets.
			msg = "the database is unavailable"
		case errors.Is(err, node.ErrUnavailable), errors.Is(err, node.ErrInsufficientStorage):
			msg = err.Error()
		}
		se = &stepError{step: stepFinalize, msg: msg}
	}
	b.log("error", se.step, se.msg)
	b.setStatus(StatusError, &Reason{Message: se.msg, Step: se.step, LogEntries: b.stepLogs(se.step, 50)})
}

// state is what the steps so far have set.
type state struct {
	user    string
	workdir string // "" = the user's home
	env     map[string]string
}

func (st *state) cwd() string {
	if st.workdir != "" {
		return st.workdir
	}
	return home(st.user)
}

// apply records what an ENV, USER or WORKDIR step sets (a step taken
// from the cache is applied without running it).
func (st *state) apply(step Step) {
	switch step.Type {
	case StepEnv:
		for i := 0; i+1 < len(step.Args); i += 2 {
			st.env[step.Args[i]] = step.Args[i+1]
		}
	case StepUser:
		st.user = step.Args[0]
	case StepWorkdir:
		dir := step.Args[0]
		if !path.IsAbs(dir) {
			dir = path.Join(st.cwd(), dir)
		}
		st.workdir = path.Clean(dir)
	}
}

func home(user string) string {
	if user == "root" {
		return "/root"
	}
	return "/home/" + user
}

// execute runs the build; its template is replaced only when all went well.
func (s *Service) execute(ctx context.Context, b *build, spec Spec, base Base) error {
	// A name the build could not take fails it now, not after its steps.
	if _, err := s.replaced(ctx, b, stepBase); err != nil {
		return err
	}
	baseName := base.Template
	if base.Image != "" {
		name, err := s.pullBase(ctx, b, base.Image, spec.Force)
		if err != nil {
			return err
		}
		baseName = name
	}
	tpl, err := s.node.GetTemplate(ctx, baseName)
	if errors.Is(err, node.ErrNotFound) || (err == nil && !b.mayUse(tpl.TeamID)) {
		// Another team's template is, to this build, one that does not
		// exist.
		return failStep(stepBase, "base template %q does not exist", baseName)
	} else if err != nil {
		return err
	}
	if tpl.ID == b.templateID || tpl.Name == b.templateID {
		return failStep(stepBase, "a template cannot be built from itself")
	}
	stepKeys, final := spec.Keys(tpl.ID)
	if s.reuse(ctx, b, spec, final) {
		return nil
	}
	b.log("info", stepBase, "FROM "+baseName)
	from := baseName
	reused, snap := s.cachedPrefix(ctx, b, spec, stepKeys)
	if snap != nil {
		from = snap.ID
	}
	sb, err := s.node.Create(ctx, node.CreateRequest{Template: from, VCPU: b.vcpu, MemoryMB: b.memoryMB,
		Timeout: s.cfg.BuildTimeout, Metadata: map[string]string{"aenv.build": b.id, "aenv.template": b.templateID},
		TeamID: b.team})
	if err != nil {
		if errors.Is(err, node.ErrInvalid) {
			return failStep(stepBase, "build sandbox: %v", err)
		}
		return fmt.Errorf("create build sandbox: %w", err)
	}
	defer func() {
		killCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := s.node.Kill(killCtx, sb.ID); err != nil && !errors.Is(err, node.ErrNotFound) {
			s.logger.WarnContext(ctx, "kill build sandbox", "sandbox", sb.ID, "err", err)
		}
	}()
	target, err := s.node.Reach(ctx, sb.ID, node.EnvdPort)
	if err != nil {
		return fmt.Errorf("reach build sandbox: %w", err)
	}
	defer target.Release()
	st := &state{user: tpl.DefaultUser, workdir: tpl.DefaultWorkdir, env: map[string]string{}}
	if st.user == "" {
		st.user = template.DefaultUser
	}
	for i, step := range spec.Steps {
		name := strconv.Itoa(i + 1)
		if i < reused {
			st.apply(step)
			b.log("info", name, fmt.Sprintf("CACHED [%d/%d] %s", i+1, len(spec.Steps), step.Describe()))
			continue
		}
		b.log("info", name, fmt.Sprintf("[%d/%d] %s", i+1, len(spec.Steps), step.Describe()))
		began := time.Now()
		if err := s.step(target.Ctx, b, target.Envd, st, name, step); err != nil {
			return stoppedOr(target.Ctx, name, err)
		}
		if s.worthCaching(step, time.Since(began)) {
			s.cacheStep(ctx, b, sb.ID, stepKeys[i], stepKeys)
		}
	}
	if err := s.finalize(target.Ctx, b, target.Envd, st, spec); err != nil {
		return stoppedOr(target.Ctx, stepFinalize, err)
	}
	tplOut, err := s.replace(ctx, b, sb.ID, st)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.done[b.templateID] = cached{key: final, templateID: tplOut.ID, buildID: b.id}
	s.mu.Unlock()
	s.pruneStepCache(ctx, b.templateID, stepKeys)
	return nil
}

// stoppedOr explains a build sandbox that stopped under a step (it ran
// out of memory, or reached its deadline) as that step's failure.
func stoppedOr(ctx context.Context, step string, err error) error {
	if cause := context.Cause(ctx); cause != nil && errors.Is(cause, node.ErrStopped) {
		return failStep(step, "the build sandbox stopped during step %s: %v", step, cause)
	}
	return err
}

// reuse keeps the template when its last build had the same definition
// on the same base and nothing asks to skip the cache. Caching is whole
// builds only: one changed step runs every step again.
func (s *Service) reuse(ctx context.Context, b *build, spec Spec, key string) bool {
	if spec.Forced() {
		return false
	}
	s.mu.Lock()
	c, ok := s.done[b.templateID]
	s.mu.Unlock()
	if !ok || c.key != key {
		return false
	}
	cur, err := s.node.GetTemplate(ctx, b.templateID)
	if err != nil || cur.ID != c.templateID || !b.mayReplace(cur.TeamID) {
		return false
	}
	b.log("info", stepBase, "CACHED FROM template "+cur.ID)
	for i, step := range spec.Steps {
		b.log("info", strconv.Itoa(i+1), fmt.Sprintf("CACHED [%d/%d] %s", i+1, len(spec.Steps), step.Describe()))
	}
	if spec.StartCmd != "" {
		b.log("info", stepFinalize, "CACHED start command "+spec.StartCmd)
	}
	return true
}

// pullBase makes a template of an image (once; later builds reuse it
// unless forced) and returns its name.
func (s *Service) pullBase(ctx context.Context, b *build, ref string, force bool) (string, error) {
	name := ImageTemplateName(ref)
	if tpl, err := s.node.GetTemplate(ctx, name); err == nil {
		if tpl.TeamID != "" {
			// The build service makes these public; no one else may
			// take the name (ReservedName).
			return "", failStep(stepBase, "template %q is not the build service's pull of %s", name, ref)
		}
		if !force {
			b.log("info", stepBase, fmt.Sprintf("Using image %s pulled earlier", ref))
			return name, nil
		}
		if err := s.node.DeleteTemplate(ctx, name); err != nil {
			b.log("warn", stepBase, fmt.Sprintf("Keeping image %s pulled earlier: %v", ref, err))
			return name, nil
		}
	}
	b.log("info", stepBase, "Pulling image "+ref)
	if _, err := s.node.BuildTemplate(ctx, template.ImageRequest{Reference: ref, Name: name}); err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", failStep(stepBase, "pull %s: %v", ref, err)
	}
	return name, nil
}

// step runs one step in the build sandbox.
func (s *Service) step(ctx context.Context, b *build, envd *envdclient.Client, st *state, name string, step Step) error {
	switch step.Type {
	case StepRun:
		user := st.user
		if len(step.Args) > 1 && step.Args[1] != "" {
			user = step.Args[1]
		}
		return s.runLogged(ctx, b, envd, name, step.Args[0], user, st.cwd(), st.env)
	case StepEnv:
		st.apply(step)
		vars := map[string]string{}
		for i := 0; i+1 < len(step.Args); i += 2 {
			vars[step.Args[i]] = step.Args[i+1]
		}
		// envd keeps them for every later process, in the build and in
		// sandboxes restored from the template.
		if err := envd.Init(ctx, envdclient.InitRequest{EnvVars: vars}); err != nil {
			return fmt.Errorf("set env: %w", err)
		}
		return nil
	case StepUser:
		st.apply(step)
		if st.user == template.DefaultUser {
			// E2B's templates all have its default user (a Dockerfile's
			// build ends with USER user when it set none); an image
			// without one gets it here.
			if err := s.runLogged(ctx, b, envd, name, addDefaultUserScript, "root", "/",
				map[string]string{"AENV_USER": st.user}); err != nil {
				return err
			}
		}
		// Starting a process as the user checks it the way E2B does: an
		// unknown one fails the step with envd's refusal.
		return s.runLogged(ctx, b, envd, name, "true", st.user, "/", nil)
	case StepWorkdir:
		st.apply(step)
		return s.runLogged(ctx, b, envd, name, `[ -d "$D" ] || { mkdir -p "$D" && chown "$U" "$D"; }`, "root", "/",
			map[string]string{"D": st.workdir, "U": st.user})
	case StepCopy:
		return s.copyStep(ctx, b, envd, st, name, step)
	}
	return failStep(name, "unsupported step type %s", step.Type)
}

// addDefaultUserScript creates $AENV_USER with a home under /home unless
// the image has it.
const addDefaultUserScript = `id -u "$AENV_USER" >/dev/null 2>&1 && exit 0
if command -v useradd >/dev/null 2>&1; then
  useradd --create-home --shell /bin/bash "$AENV_USER"
elif command -v adduser >/dev/null 2>&1; then
  adduser -D -s /bin/bash "$AENV_USER"
else
  echo "the image has no user $AENV_USER and no useradd or adduser to create it" >&2
  exit 1
fi
`

// copyScript puts the matches of $SRC (a path or glob inside the archive)
// at $DEST the way Docker's COPY does: a directory's contents go into
// DEST, one file becomes DEST unless DEST ends in "/" or is a directory.
// Copies belong to $OWNER; $MODE, when set, applies to copied files.
const copyScript = `set -e
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$ARCHIVE"' EXIT
tar -xf "$ARCHIVE" -C "$tmp" --no-same-owner
cd "$tmp"
case "$DEST" in /*) dest="$DEST" ;; *) dest="$BASE/$DEST" ;; esac
IFS=
set -- $SRC
[ -e "$1" ] || { echo "no files match $SRC" >&2; exit 1; }
chown -R "$OWNER" -- "$@"
[ -z "$MODE" ] || find "$@" -type f -exec chmod "$MODE" {} +
mk() { [ -d "$1" ] || { mkdir -p "$1" && chown "$OWNER" "$1"; }; }
if [ $# -eq 1 ] && [ ! -d "$1" ] && [ "${DEST%/}" = "$DEST" ] && [ ! -d "$dest" ]; then
  mk "$(dirname "$dest")"
  cp -a "$1" "$dest"
else
  mk "$dest"
  for f in "$@"; do
    if [ -d "$f" ]; then cp -a "$f"/. "$dest"/; else cp -a "$f" "$dest"/; fi
  done
fi
`

func (s *Service) copyStep(ctx context.Context, b *build, envd *envdclient.Client, st *state, name string, step Step) error {
	f, _, err := s.uploads.Open(b.templateID, step.FilesHash)
	if err != nil {
		return failStep(name, "COPY %s: %v", step.Args[0], err)
	}
	defer f.Close()
	archive := "/tmp/.aenv-copy-" + step.FilesHash[:16] + ".tar"
	if err := envd.WriteFile(ctx, archive, f, "root"); err != nil {
		return fmt.Errorf("copy %s into the build sandbox: %w", step.Args[0], err)
	}
	owner := st.user
	if len(step.Args) > 2 && step.Args[2] != "" {
		owner = step.Args[2]
	}
	mode := ""
	if len(step.Args) > 3 {
		mode = step.Args[3]
	}
	return s.runLogged(ctx, b, envd, name, copyScript, "root", "/", map[string]string{
		"ARCHIVE": archive, "SRC": step.Args[0], "DEST": step.Args[1], "BASE": st.cwd(),
		"OWNER": owner, "MODE": mode,
	})
}

// runLogged runs a command to its end, its output going to the log; a
// non-zero exit fails the step with the output's tail.
func (s *Service) runLogged(ctx context.Context, b *build, envd *envdclient.Client, step, cmd, user, cwd string, env map[string]string) error {
	out := &logWriter{b: b, step: step}
	p, err := envd.Start(ctx, envdclient.ProcessSpec{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd},
		Envs: env, Cwd: cwd, User: user, KillOnCancel: true})
	if err != nil {
		if errors.Is(err, envdclient.ErrUnauthenticated) {
			return failStep(step, "%s", unknownUserMessage(step, user))
		}
		if errors.Is(err, envdclient.ErrInvalidArgument) || errors.Is(err, envdclient.ErrNotFound) {
			return failStep(step, "step %s: %v", step, err)
		}
		return fmt.Errorf("step %s: %w", step, err)
	}
	exit, err := p.Wait(envdclient.Output{Stdout: out, Stderr: out})
	out.flush()
	if err != nil {
		return fmt.Errorf("step %s: %w", step, err)
	}
	if code := exit.ShellCode(); code != 0 {
		return failStep(step, "step %s failed with exit code %d: %s", step, code, out.tail())
	}
	return nil
}

// unknownUserMessage is a step's failure as a user the sandbox lacks, in
// E2B's words (its envd's refusal), which users of its SDK match on.
func unknownUserMessage(step, user string) string {
	return fmt.Sprintf("step %s: unauthenticated: invalid username: '%s'", step, user)
}

// finalize starts the start command and waits for the ready command to
// succeed.
func (s *Service) finalize(ctx context.Context, b *build, envd *envdclient.Client, st *state, spec Spec) error {
	if spec.StartCmd == "" {
		return nil
	}
	b.log("info", stepFinalize, "Starting: "+spec.StartCmd)
	startCtx, detach := context.WithCancel(ctx)
	defer detach()
	out := &logWriter{b: b, step: stepFinalize}
	p, err := envd.Start(startCtx, envdclient.ProcessSpec{Cmd: "/bin/bash", Args: []string{"-l", "-c", spec.StartCmd},
		Envs: st.env, Cwd: st.cwd(), User: st.user})
	if err != nil {
		return failStep(stepFinalize, "start command: %v", err)
	}
	exited := make(chan envdclient.Exit, 1)
	go func() {
		exit, err := p.Wait(envdclient.Output{Stdout: out, Stderr: out})
		if err == nil {
			exited <- exit
		}
	}()
	if spec.ReadyCmd == "" {
		return nil
	}
	b.log("info", stepFinalize, "Waiting for: "+spec.ReadyCmd)
	deadline := time.Now().Add(s.cfg.ReadyTimeout)
	for {
		res, err := envd.Run(ctx, envdclient.RunRequest{Command: spec.ReadyCmd, Envs: st.env, Cwd: st.cwd(),
			User: st.user, Timeout: 30 * time.Second, MaxOutputBytes: 64 << 10})
		if err != nil {
			return fmt.Errorf("ready command: %w", err)
		}
		if res.ExitCode == 0 {
			b.log("info", stepFinalize, "Ready")
			// Ending the stream leaves the process running (envd keeps the
			// processes of clients that went away), into the snapshot.
			return nil
		}
		select {
		case exit := <-exited:
			out.flush()
			return failStep(stepFinalize, "start command exited with code %d before it was ready: %s",
				exit.ShellCode(), out.tail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return failStep(stepFinalize, "ready command %q did not succeed within %s", spec.ReadyCmd, s.cfg.ReadyTimeout)
		}
	}
}

// replace snapshots the build sandbox as the template, with the build's
// final user and workdir as its defaults. An older template of the name
// stays until the new checkpoint exists.
func (s *Service) replace(ctx context.Context, b *build, sandboxID string, st *state) (*store.Template, error) {
	b.log("info", stepFinalize, "Snapshotting the template")
	old, err := s.replaced(ctx, b, stepFinalize)
	if err != nil {
		return nil, err
	}
	tpl, err := s.node.Snapshot(ctx, node.SnapshotRequest{SandboxID: sandboxID, Name: b.templateID,
		Kind: store.KindSandboxTemplate, DefaultUser: st.user, DefaultWorkdir: st.workdir, Replace: old != nil})
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return tpl, nil
}

// replaced is the template b's build replaces (nil: the name is free),
// or, as a failure of step, why the build may not take the name: another
// team's, a template builds do not replace, or another node's not in the
// object store yet (a team's names are the cluster's; that node's files
// are its alone until uploaded).
func (s *Service) replaced(ctx context.Context, b *build, step string) (*store.Template, error) {
	old, err := s.node.TemplateNamed(ctx, b.templateID)
	switch {
	case errors.Is(err, node.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	case !b.mayReplace(old.TeamID):
		return nil, failStep(step, "template name %q is taken", b.templateID)
	case old.TeamID == "":
		return nil, failStep(step, "%q is a public template's name", b.templateID)
	case old.TeamID != b.team:
		return nil, failStep(step, "template %q is team %s's: a build replaces only its own team's templates "+
			"(build it with a key of that team)", b.templateID, old.TeamID)
	case old.Kind != store.KindSandboxTemplate:
		return nil, failStep(step, "%q names a %s template that builds do not replace", b.templateID, old.Kind)
	case !store.Replaceable(old, b.team, s.cfg.NodeID):
		return nil, failStep(step, "template %q is node %s's and not in the object store yet: "+
			"rebuild it once it is uploaded", b.templateID, old.NodeID)
	}
	return old, nil
}

func (s *Service) dropTemplate(ctx context.Context, id string) {
	if err := s.node.DeleteTemplate(context.WithoutCancel(ctx), id); err != nil {
		s.logger.WarnContext(ctx, "delete interim template", "template", id, "err", err)
	}
}

// logWriter turns a step's output into log lines, up to maxStepLogBytes,
// and keeps its last bytes for a failure's message.
type logWriter struct {
	b       *build
	step    string
	mu      sync.Mutex
	partial []byte
	written int
	last    []byte
}

const tailBytes = 2048

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = append(w.last, p...)
	if len(w.last) > tailBytes {
		w.last = w.last[len(w.last)-tailBytes:]
	}
	if w.written >= maxStepLogBytes {
		return len(p), nil
	}
	w.written += len(p)
	w.partial = append(w.partial, p...)
	for {
		i := strings.IndexByte(string(w.partial), '\n')
		if i < 0 {
			break
		}
		w.b.log("info", w.step, string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
	if w.written >= maxStepLogBytes {
		w.b.log("warn", w.step, "output too long; the rest is not logged")
	}
	return len(p), nil
}

func (w *logWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) > 0 {
		w.b.log("info", w.step, string(w.partial))
		w.partial = nil
	}
}

func (w *logWriter) tail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.TrimSpace(string(w.last))
}
