// Package dockerfile turns a single-stage Dockerfile into the steps of an
// E2B template build (the v3 build API's RUN, COPY, ENV, WORKDIR and USER
// steps and a start command), the way E2B's SDK does for fromDockerfile.
// It reads the subset a sandbox template can honour and names the line of
// anything else; it does no I/O.
package dockerfile

import (
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strings"
)

// Step types, as the build API spells them.
const (
	StepRun     = "RUN"
	StepCopy    = "COPY"
	StepEnv     = "ENV"
	StepWorkdir = "WORKDIR"
	StepUser    = "USER"
)

// Plan is a Dockerfile as a build.
type Plan struct {
	// From is the FROM reference with build arguments expanded: an image
	// reference or the name of a template.
	From string
	// Steps in order. A COPY step's Args are the source (relative to the
	// context, possibly a glob), the destination, the owner and the mode,
	// as the build API takes them; the caller adds the files' hash.
	Steps []Step
	// StartCmd is CMD and ENTRYPOINT as one shell command; "" if neither.
	StartCmd string
	// Warnings name instructions that were ignored and build arguments
	// that nothing used.
	Warnings []string
}

// Step is one build step and the Dockerfile line it came from.
type Step struct {
	Type string
	Args []string
	Line int
}

// Parse reads a Dockerfile. buildArgs are --build-arg values; they
// override ARG defaults.
func Parse(text string, buildArgs map[string]string) (*Plan, error) {
	lines, escape, err := split(text)
	if err != nil {
		return nil, err
	}
	p := &parser{plan: &Plan{}, escape: escape, buildArgs: buildArgs, used: map[string]bool{},
		global: map[string]string{}, args: map[string]string{}, env: map[string]string{}}
	for _, l := range lines {
		if err := p.instruction(l); err != nil {
			return nil, fmt.Errorf("line %d: %s: %w", l.num, l.keyword, err)
		}
	}
	if p.plan.From == "" {
		return nil, fmt.Errorf("the Dockerfile has no FROM instruction")
	}
	p.plan.StartCmd = startCommand(p.entrypoint, p.cmd)
	p.plan.Steps = withDockerDefaults(p.plan.Steps)
	var unused []string
	for k := range buildArgs {
		if !p.used[k] {
			unused = append(unused, k)
		}
	}
	sort.Strings(unused)
	if len(unused) > 0 {
		p.plan.Warnings = append(p.plan.Warnings, "build arguments not declared by ARG: "+strings.Join(unused, ", "))
	}
	return p.plan, nil
}

// A Dockerfile's steps run as root in / until USER and WORKDIR say
// otherwise, as in Docker; a template whose Dockerfile never sets them
// gets E2B's defaults for its sandboxes. E2B's SDK frames fromDockerfile
// the same way, so both builds agree.
const (
	buildUser      = "root"
	buildWorkdir   = "/"
	defaultUser    = "user"
	defaultWorkdir = "/home/user"
)

// withDockerDefaults frames the Dockerfile's steps with the user and
// workdir Docker starts with, and E2B's sandbox defaults at the end for
// what the Dockerfile left unset. The added steps have no line.
func withDockerDefaults(steps []Step) []Step {
	userSet, workdirSet := false, false
	for _, st := range steps {
		userSet = userSet || st.Type == StepUser
		workdirSet = workdirSet || st.Type == StepWorkdir
	}
	out := make([]Step, 0, len(steps)+4)
	out = append(out, Step{Type: StepUser, Args: []string{buildUser}}, Step{Type: StepWorkdir, Args: []string{buildWorkdir}})
	out = append(out, steps...)
	if !userSet {
		out = append(out, Step{Type: StepUser, Args: []string{defaultUser}})
	}
	if !workdirSet {
		out = append(out, Step{Type: StepWorkdir, Args: []string{defaultWorkdir}})
	}
	return out
}

type parser struct {
	plan      *Plan
	escape    byte
	buildArgs map[string]string
	used      map[string]bool   // build arguments an ARG declared
	global    map[string]string // ARGs before FROM: they reach only FROM and re-declarations
	args      map[string]string // ARGs of the stage: RUN sees them, the template keeps none
	argOrder  []string
	env       map[string]string
	cmd       *command
	// entrypoint, when set, resets an earlier CMD (as Docker does).
	entrypoint *command
}

// command is a CMD or ENTRYPOINT: an exec form's words or a shell form.
type command struct {
	exec  []string
	shell string
}

func (p *parser) instruction(l line) error {
	if p.plan.From == "" && l.keyword != "FROM" && l.keyword != "ARG" {
		return fmt.Errorf("only ARG may come before FROM")
	}
	switch l.keyword {
	case "FROM":
		return p.from(l)
	case "ARG":
		return p.arg(l)
	case "RUN":
		return p.run(l)
	case "COPY", "ADD":
		return p.copy(l)
	case "ENV":
		return p.envInstr(l)
	case "WORKDIR", "USER":
		return p.single(l)
	case "CMD", "ENTRYPOINT":
		c := p.command(l.rest)
		if l.keyword == "CMD" {
			p.cmd = c
		} else {
			p.entrypoint, p.cmd = c, nil
		}
		return nil
	case "EXPOSE", "LABEL", "MAINTAINER", "VOLUME":
		p.plan.Warnings = append(p.plan.Warnings,
			fmt.Sprintf("line %d: %s has no effect on a sandbox template; ignored", l.num, l.keyword))
		return nil
	case "HEALTHCHECK", "ONBUILD", "SHELL", "STOPSIGNAL":
		return fmt.Errorf("not supported by aenv build")
	}
	return fmt.Errorf("unknown instruction")
}

// vars is what ${NAME} expands to in the stage: ENV over ARG.
func (p *parser) vars() map[string]string {
	out := make(map[string]string, len(p.args)+len(p.env))
	for k, v := range p.args {
		out[k] = v
	}
	for k, v := range p.env {
		out[k] = v
	}
	return out
}

func (p *parser) from(l line) error {
	if p.plan.From != "" {
		return fmt.Errorf("multi-stage builds are not supported: a Dockerfile has one FROM")
	}
	ws, err := words(l.rest, p.escape, p.global)
	if err != nil {
		return err
	}
	flags, ws := cutFlags(ws)
	if len(flags) > 0 {
		return fmt.Errorf("flag %s is not supported", flags[0])
	}
	switch {
	case len(ws) == 3 && strings.EqualFold(ws[1], "AS"):
		// A name for the one stage is harmless: nothing can refer to it.
	case len(ws) != 1:
		return fmt.Errorf("wants one image or template name")
	}
	if ws[0] == "scratch" {
		return fmt.Errorf("FROM scratch is not supported: a sandbox needs a root filesystem with a shell")
	}
	p.plan.From = ws[0]
	return nil
}

func (p *parser) arg(l line) error {
	ws, err := words(l.rest, p.escape, nil)
	if err != nil {
		return err
	}
	if len(ws) == 0 {
		return fmt.Errorf("wants a name")
	}
	for _, w := range ws {
		name, def, hasDef := strings.Cut(w, "=")
		if !validName(name) {
			return fmt.Errorf("invalid name %q", name)
		}
		if hasDef {
			// Defaults are expanded like any other value.
			exp, err := words(def, p.escape, p.scope())
			if err != nil {
				return err
			}
			def = strings.Join(exp, " ")
		}
		val, given := p.buildArgs[name]
		if given {
			p.used[name] = true
		}
		if !given && !hasDef && p.plan.From != "" {
			// A stage's ARG without a default takes the global one's value.
			val, given = p.global[name]
		}
		if !given {
			val = def
		}
		if p.plan.From == "" {
			p.global[name] = val
			continue
		}
		if _, seen := p.args[name]; !seen {
			p.argOrder = append(p.argOrder, name)
		}
		p.args[name] = val
	}
	return nil
}

// scope is what an ARG default may refer to.
func (p *parser) scope() map[string]string {
	if p.plan.From == "" {
		return p.global
	}
	return p.vars()
}

func (p *parser) run(l line) error {
	if strings.HasPrefix(l.rest, "--") {
		ws, _ := words(l.rest, p.escape, nil)
		flags, _ := cutFlags(ws)
		return fmt.Errorf("flag %s is not supported", flags[0])
	}
	cmd := p.command(l.rest)
	script := cmd.shell
	if cmd.exec != nil {
		script = quoteAll(cmd.exec)
	}
	if strings.TrimSpace(script) == "" {
		return fmt.Errorf("wants a command")
	}
	if hasHeredoc(script) {
		return fmt.Errorf("heredocs are not supported")
	}
	// ARGs are in RUN's environment, not in the template's.
	if len(p.argOrder) > 0 {
		var assign []string
		for _, k := range p.argOrder {
			if _, shadowed := p.env[k]; !shadowed {
				assign = append(assign, k+"="+quote(p.args[k]))
			}
		}
		if len(assign) > 0 {
			script = "export " + strings.Join(assign, " ") + "; " + script
		}
	}
	p.add(l, StepRun, script)
	return nil
}

func (p *parser) copy(l line) error {
	rest := l.rest
	var flags []string
	for strings.HasPrefix(rest, "--") {
		f, r, _ := strings.Cut(rest, " ")
		fw, err := words(f, p.escape, p.vars())
		if err != nil {
			return err
		}
		flags = append(flags, strings.Join(fw, ""))
		rest = strings.TrimSpace(r)
	}
	var ws []string
	if ex, ok := p.execForm(rest); ok {
		for _, e := range ex {
			w, err := words(e, p.escape, p.vars())
			if err != nil {
				return err
			}
			ws = append(ws, strings.Join(w, " "))
		}
	} else {
		var err error
		if ws, err = words(rest, p.escape, p.vars()); err != nil {
			return err
		}
	}
	owner, mode := "", ""
	for _, f := range flags {
		name, val, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		switch name {
		case "chown":
			owner = val
		case "chmod":
			if !isOctal(val) {
				return fmt.Errorf("--chmod=%s: only octal modes are supported", val)
			}
			mode = val
		case "link":
			// Docker's layer-linking hint; a copy is a copy here.
		case "from":
			return fmt.Errorf("--from is not supported: a Dockerfile has one stage")
		default:
			return fmt.Errorf("flag --%s is not supported", name)
		}
	}
	if len(ws) < 2 {
		return fmt.Errorf("wants at least one source and a destination")
	}
	if hasHeredoc(strings.Join(ws, " ")) {
		return fmt.Errorf("heredocs are not supported")
	}
	srcs, dest := ws[:len(ws)-1], ws[len(ws)-1]
	if len(srcs) > 1 && !strings.HasSuffix(dest, "/") {
		return fmt.Errorf("with more than one source the destination must end in /")
	}
	for _, src := range srcs {
		clean, err := contextPath(src, l.keyword)
		if err != nil {
			return err
		}
		p.add(l, StepCopy, clean, dest, owner, mode)
	}
	return nil
}

// contextPath is a COPY source as a path inside the build context.
func contextPath(src, keyword string) (string, error) {
	if strings.Contains(src, "://") || strings.HasPrefix(src, "git@") {
		return "", fmt.Errorf("remote source %s is not supported; download it in a RUN step", src)
	}
	if keyword == "ADD" && isArchive(src) {
		return "", fmt.Errorf("ADD of archive %s: unpacking is not supported; COPY it and unpack it in a RUN step", src)
	}
	if rel := path.Clean(src); rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("source %s leaves the build context", src)
	}
	// An absolute source is inside the context too, as in Docker.
	clean := path.Clean("/" + src)[1:]
	if clean == "" {
		clean = "."
	}
	return clean, nil
}

func isArchive(p string) bool {
	for _, ext := range []string{".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst"} {
		if strings.HasSuffix(strings.ToLower(p), ext) {
			return true
		}
	}
	return false
}

func (p *parser) envInstr(l line) error {
	ws, err := words(l.rest, p.escape, p.vars())
	if err != nil {
		return err
	}
	if len(ws) == 0 {
		return fmt.Errorf("wants NAME=VALUE")
	}
	var args []string
	if !strings.Contains(ws[0], "=") {
		// The old form: ENV NAME the rest of the line.
		if len(ws) < 2 {
			return fmt.Errorf("wants NAME=VALUE or NAME VALUE")
		}
		args = []string{ws[0], strings.Join(ws[1:], " ")}
	} else {
		for _, w := range ws {
			k, v, ok := strings.Cut(w, "=")
			if !ok {
				return fmt.Errorf("%q is not NAME=VALUE", w)
			}
			args = append(args, k, v)
		}
	}
	for i := 0; i < len(args); i += 2 {
		if !validName(args[i]) {
			return fmt.Errorf("invalid name %q", args[i])
		}
		p.env[args[i]] = args[i+1]
	}
	p.add(l, StepEnv, args...)
	return nil
}

// single reads WORKDIR and USER, which take one (expanded) argument.
func (p *parser) single(l line) error {
	ws, err := words(l.rest, p.escape, p.vars())
	if err != nil {
		return err
	}
	if len(ws) == 0 {
		return fmt.Errorf("wants an argument")
	}
	arg := strings.Join(ws, " ")
	if l.keyword == StepUser {
		if len(ws) != 1 {
			return fmt.Errorf("wants one user")
		}
		if strings.Contains(arg, ":") {
			return fmt.Errorf("USER with a group is not supported; the user's own groups apply")
		}
	}
	p.add(l, l.keyword, arg)
	return nil
}

func (p *parser) add(l line, typ string, args ...string) {
	p.plan.Steps = append(p.plan.Steps, Step{Type: typ, Args: args, Line: l.num})
}

// command reads a RUN, CMD or ENTRYPOINT: the exec form (a JSON array of
// strings) or else the shell form.
func (p *parser) command(rest string) *command {
	if ex, ok := p.execForm(rest); ok {
		return &command{exec: ex}
	}
	return &command{shell: rest}
}

func (p *parser) execForm(rest string) ([]string, bool) {
	if !strings.HasPrefix(rest, "[") {
		return nil, false
	}
	var ex []string
	if json.Unmarshal([]byte(rest), &ex) != nil || len(ex) == 0 {
		return nil, false
	}
	return ex, true
}

// startCommand joins ENTRYPOINT and CMD as Docker runs them.
func startCommand(entrypoint, cmd *command) string {
	switch {
	case entrypoint != nil && entrypoint.exec == nil:
		return entrypoint.shell // a shell-form ENTRYPOINT ignores CMD
	case entrypoint != nil:
		words := append([]string{}, entrypoint.exec...)
		if cmd != nil && cmd.exec != nil {
			words = append(words, cmd.exec...)
		} else if cmd != nil {
			words = append(words, "/bin/sh", "-c", cmd.shell)
		}
		return quoteAll(words)
	case cmd != nil && cmd.exec != nil:
		return quoteAll(cmd.exec)
	case cmd != nil:
		return cmd.shell
	}
	return ""
}

// cutFlags splits leading --flag words from the rest.
func cutFlags(ws []string) (flags, rest []string) {
	i := 0
	for i < len(ws) && strings.HasPrefix(ws[i], "--") {
		i++
	}
	return ws[:i], ws[i:]
}

func hasHeredoc(s string) bool {
	for i := 0; i+2 < len(s); i++ {
		if s[i] == '<' && s[i+1] == '<' && (i == 0 || s[i-1] != '<') && s[i+2] != '<' {
			j := i + 2
			if j < len(s) && s[j] == '-' {
				j++
			}
			if j < len(s) && (s[j] == '"' || s[j] == '\'') {
				j++
			}
			if j < len(s) && isNameByte(s[j], true) {
				return true
			}
		}
	}
	return false
}

func isOctal(s string) bool {
	if s == "" || len(s) > 4 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '7' {
			return false
		}
	}
	return true
}

// quote makes s one shell word.
func quote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func quoteAll(ws []string) string {
	q := make([]string, len(ws))
	for i, w := range ws {
		q[i] = quote(w)
	}
	return strings.Join(q, " ")
}
