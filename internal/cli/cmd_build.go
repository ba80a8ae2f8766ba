package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
	"github.com/aenv-dev/aenv/internal/dockerfile"
)

// A build's status and new log lines are read every buildPollInterval,
// sooner at first: a build the server finds cached ends in milliseconds.
const (
	buildPollFirst    = 20 * time.Millisecond
	buildPollInterval = 250 * time.Millisecond
)

type buildOptions struct {
	file      string
	name      string
	buildArgs []string
	noCache   bool
	readyCmd  string
	cpu       int
	memoryMB  int
	quiet     bool
}

func (a *app) buildCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	var o buildOptions
	cmd := &cobra.Command{
		Use:   "build -t NAME [-f Dockerfile] [--build-arg K=V]... [CONTEXT]",
		Short: "Build a template from a Dockerfile",
		Long: `Build the template NAME from a Dockerfile, the way E2B's Template.build does:
the server runs each step in a sandbox started from the FROM base and
snapshots it. FROM names an image (pulled by the server; E2B's e2bdev/base is
aenv's "base") or an existing template. RUN, COPY and ADD of files in CONTEXT
(default "."; uploaded once, by content hash), ENV, ARG (set with
--build-arg), WORKDIR and USER become build steps; CMD and ENTRYPOINT become
the start command, which is running in every sandbox created from the
template. As in Docker, steps run as root in / until USER and WORKDIR say
otherwise; the final USER and WORKDIR are the template's defaults (user and
/home/user when the Dockerfile sets none, as in E2B). A symbolic link in
CONTEXT is copied as a link; a source reached through a link that leads
out of CONTEXT is refused.

Steps are cached on the server: a rebuild runs from the first step that
changed. Not supported, with an error naming the line: more than one FROM,
COPY --from, RUN --mount, heredocs, remote or archive ADD sources,
HEALTHCHECK, ONBUILD, SHELL and STOPSIGNAL. EXPOSE, LABEL, MAINTAINER and
VOLUME are ignored, and .dockerignore is not read.

The build's log streams to stderr; the template's name is printed when it is
ready (with -o json, the build's final status). A failed build exits 1 with
the failing step's output and leaves the previous template in place.
Interrupting the command does not stop the build on the server.`,
		Example: `  aenv build -t my-app .
  aenv build -f docker/Dockerfile -t my-app --build-arg VERSION=1.2 ./src
  aenv build -t web --ready-cmd 'curl -sf localhost:8080' .`,
		Args: args(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			if o.name == "" {
				return usageError{errors.New("-t/--tag NAME is required")}
			}
			contextDir := "."
			if len(argv) == 1 {
				contextDir = argv[0]
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			return a.runBuild(cmd.Context(), c, contextDir, o, asJSON)
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	fl := cmd.Flags()
	fl.StringVarP(&o.file, "file", "f", "", `the Dockerfile (default: CONTEXT/Dockerfile)`)
	fl.StringVarP(&o.name, "tag", "t", "", "template name (NAME or NAME:TAG)")
	fl.StringArrayVar(&o.buildArgs, "build-arg", nil, "set an ARG: K=V, or K to take its value from the environment")
	fl.BoolVar(&o.noCache, "no-cache", false, "run every step again")
	fl.StringVar(&o.readyCmd, "ready-cmd", "", "command that succeeds once the start command is ready; the snapshot waits for it")
	fl.IntVar(&o.cpu, "cpu", 0, "vCPUs of the build sandbox and the template (default: the server's)")
	fl.IntVar(&o.memoryMB, "memory", 0, "memory in MiB of the build sandbox and the template (default: the server's)")
	fl.BoolVarP(&o.quiet, "quiet", "q", false, "no log output unless the build fails")
	return cmd
}

func (a *app) runBuild(ctx context.Context, c *client.Client, contextDir string, o buildOptions, asJSON bool) error {
	file := o.file
	if file == "" {
		file = filepath.Join(contextDir, "Dockerfile")
	}
	text, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read Dockerfile: %w", err)
	}
	buildArgs, err := a.parseBuildArgs(o.buildArgs)
	if err != nil {
		return err
	}
	plan, err := dockerfile.Parse(string(text), buildArgs)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if o.readyCmd != "" && plan.StartCmd == "" {
		return usageError{errors.New("--ready-cmd needs a CMD or ENTRYPOINT in the Dockerfile")}
	}
	for _, w := range plan.Warnings {
		fmt.Fprintf(a.stderr, "warning: %s: %s\n", file, w)
	}
	spec, err := a.buildSpec(ctx, c, plan, o)
	if err != nil {
		return err
	}
	archives, err := packCopies(contextDir, plan, &spec)
	if err != nil {
		return err
	}
	defer archives.remove()

	log := newBuildLog(a.stderr, o.quiet)
	ref, err := c.RequestTemplateBuild(ctx, client.TemplateBuildRequest{Name: o.name, CPUCount: o.cpu, MemoryMB: o.memoryMB})
	if err != nil {
		return fmt.Errorf("request build of %s: %w", o.name, err)
	}
	if err := archives.upload(ctx, c, ref.TemplateID, log); err != nil {
		return err
	}
	if err := c.StartTemplateBuild(ctx, ref, spec); err != nil {
		return fmt.Errorf("start build of %s: %w", o.name, err)
	}
	final, err := followBuild(ctx, c, ref, log)
	log.done()
	if err != nil {
		return err
	}
	if final.Status != "ready" {
		return buildFailure(final, log)
	}
	if asJSON {
		return writeJSON(a.stdout, final.Raw)
	}
	fmt.Fprintln(a.stdout, ref.TemplateID)
	return nil
}

// parseBuildArgs reads --build-arg K=V; a bare K takes K's value from the
// environment, and is left out when it is empty there.
func (a *app) parseBuildArgs(raw []string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range raw {
		k, v, ok := strings.Cut(kv, "=")
		if k == "" {
			return nil, usageError{fmt.Errorf("--build-arg %q: wants NAME=VALUE", kv)}
		}
		if !ok {
			if v = a.getenv(k); v == "" {
				continue
			}
		}
		out[k] = v
	}
	return out, nil
}

// buildSpec turns a plan into the build request: FROM names a template
// when the server has one of that name, an image otherwise.
func (a *app) buildSpec(ctx context.Context, c *client.Client, plan *dockerfile.Plan, o buildOptions) (client.TemplateBuildSpec, error) {
	spec := client.TemplateBuildSpec{StartCmd: plan.StartCmd, ReadyCmd: o.readyCmd, Force: o.noCache,
		Steps: make([]client.TemplateStep, 0, len(plan.Steps))}
	templates, err := c.ListTemplates(ctx)
	if err != nil {
		return spec, fmt.Errorf("list templates: %w", err)
	}
	spec.FromImage = plan.From
	for _, t := range templates {
		if t.TemplateID == plan.From || t.Name == plan.From || contains(t.Aliases, plan.From) {
			spec.FromImage, spec.FromTemplate = "", plan.From
			break
		}
	}
	for _, st := range plan.Steps {
		spec.Steps = append(spec.Steps, client.TemplateStep{Type: st.Type, Args: st.Args})
	}
	return spec, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// followBuild polls the build until it ends, passing new log lines on.
func followBuild(ctx context.Context, c *client.Client, ref client.TemplateBuildRef, log *buildLog) (client.TemplateBuildStatus, error) {
	offset := 0
	wait := buildPollFirst
	for {
		st, err := c.TemplateBuildStatus(ctx, ref, offset)
		if err != nil {
			return st, fmt.Errorf("build status of %s: %w", ref.TemplateID, err)
		}
		offset += len(st.LogEntries)
		for _, e := range st.LogEntries {
			log.entry(e)
		}
		switch st.Status {
		case "ready", "error":
			// The log comes a page at a time: read the rest.
			for page := st; len(page.LogEntries) > 0; {
				if page, err = c.TemplateBuildStatus(ctx, ref, offset); err != nil {
					return st, fmt.Errorf("build status of %s: %w", ref.TemplateID, err)
				}
				offset += len(page.LogEntries)
				for _, e := range page.LogEntries {
					log.entry(e)
				}
			}
			return st, nil
		}
		log.tick()
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, buildPollInterval)
	}
}

// buildFailure is the error of a failed build. The step's output was
// shown as it came, unless quiet: then its last lines are shown now.
func buildFailure(st client.TemplateBuildStatus, log *buildLog) error {
	if st.Reason == nil {
		return fmt.Errorf("build of %s failed", st.TemplateID)
	}
	if log.quiet {
		for _, e := range st.Reason.LogEntries {
			fmt.Fprintln(log.w, e.Message)
		}
	}
	where := ""
	if st.Reason.Step != "" {
		where = " at step " + st.Reason.Step
	}
	return fmt.Errorf("build of %s failed%s: %s", st.TemplateID, where, st.Reason.Message)
}
