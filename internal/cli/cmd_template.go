package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
)

func (a *app) pullCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	var name, platform string
	var quiet bool
	cmd := &cobra.Command{
		Use:   "pull IMAGE",
		Short: "Make a template from an OCI image",
		Long: `Have the server pull IMAGE from its registry and make it a template, showing
progress per layer. Docker Hub short names work (ubuntu:22.04 is
docker.io/library/ubuntu:22.04); the server uses its Docker credentials for
private registries. Layers shared with earlier pulls are not fetched again.

The image's Env, WorkingDir and User become the template's defaults. The
template is named --name (default: the image's last path part, e.g.
"python" for python:3.12). Prints the template ID, or with -o json the
server's final answer.`,
		Example: `  aenv pull ubuntu:22.04 --name ubuntu
  aenv pull docker.io/library/python:3.12 --name python312
  aenv pull ghcr.io/org/img:tag --platform linux/arm64`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			return a.runPull(cmd.Context(), c, client.BuildRequest{Image: argv[0],
				Name: firstNonEmpty(name, defaultTemplateName(argv[0])), Platform: platform}, asJSON, quiet)
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	cmd.Flags().StringVar(&name, "name", "", "template name (default: from the image name)")
	cmd.Flags().StringVar(&platform, "platform", "", "image platform, e.g. linux/amd64 or linux/arm64 (default: linux/amd64)")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress output")
	return cmd
}

func (a *app) runPull(ctx context.Context, c *client.Client, req client.BuildRequest, asJSON, quiet bool) error {
	_, tty := terminalFd(a.stderr)
	progress := newPullProgress(a.stderr, tty)
	onProgress := progress.update
	if quiet {
		onProgress = nil
	}
	done, err := c.BuildTemplate(ctx, req, onProgress)
	if err != nil {
		return fmt.Errorf("pull %s: %w", req.Image, err)
	}
	if asJSON {
		return writeJSON(a.stdout, done.Raw)
	}
	fmt.Fprintln(a.stdout, done.TemplateID)
	return nil
}

// defaultTemplateName is the image's last path part without tag or
// digest: docker.io/library/python:3.12 -> python.
func defaultTemplateName(image string) string {
	image, _, _ = strings.Cut(image, "@")
	last := image[strings.LastIndex(image, "/")+1:]
	name, _, _ := strings.Cut(last, ":")
	return name
}

func (a *app) templateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "template",
		Aliases: []string{"templates"},
		Short:   "List and remove templates",
		Long: `Templates are what sandboxes start from: root filesystems made by "aenv pull"
from OCI images, the server's "base", or snapshots of sandboxes.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.templateLsCommand(), a.templateRmCommand())
	return cmd
}

func (a *app) templateLsCommand() *cobra.Command {
	var f serverFlags
	var out outputFlag
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List templates",
		Long:    `List the server's templates: ID, name or aliases, source image, vCPUs, memory, age, and the state of its newest build on the server (building, ready, error; "-" when it was not built there), and where its upload to the cluster's object store stands (pending, uploading, uploaded, failed; "-" without one).`,
		Args:    args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := out.json()
			if err != nil {
				return err
			}
			c, err := a.client(f)
			if err != nil {
				return err
			}
			templates, err := c.ListTemplates(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, raws(templates, func(t client.Template) json.RawMessage { return t.Raw }))
			}
			now := a.now()
			t := newTable(a.stdout, "TEMPLATE ID", "NAME", "KIND", "CPU", "MEMORY", "CREATED", "BUILD", "UPLOAD")
			for _, tp := range templates {
				t.row(tp.TemplateID, firstNonEmpty(tp.Name, strings.Join(tp.Aliases, ","), "-"), firstNonEmpty(tp.Kind, "-"),
					countOrDash(tp.CPUCount, ""), countOrDash(tp.MemoryMB, "MiB"), ageOf(now, tp.CreatedAt),
					firstNonEmpty(tp.BuildStatus, "-"), firstNonEmpty(tp.Upload, "-"))
			}
			return t.flush()
		},
	}
	addServerFlags(cmd, &f)
	addOutputFlag(cmd, &out)
	return cmd
}

func (a *app) templateRmCommand() *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:     "rm TEMPLATE...",
		Aliases: []string{"delete"},
		Short:   "Remove templates",
		Long:    `Remove each template (by ID or name). Sandboxes already started from it are not affected. Prints each removed template.`,
		Args:    args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := a.client(f)
			if err != nil {
				return err
			}
			return a.eachID(ids, func(id string) error { return deleteTemplate(cmd.Context(), c, id) })
		},
	}
	addServerFlags(cmd, &f)
	return cmd
}

// deleteTemplate removes a template or snapshot, naming it when it is not
// there.
func deleteTemplate(ctx context.Context, c *client.Client, ref string) error {
	return notFound(c.DeleteTemplate(ctx, ref), "%q not found", ref)
}

func countOrDash(n int, unit string) string {
	if n <= 0 {
		return "-"
	}
	return strconv.Itoa(n) + unit
}

// ageOf formats an RFC 3339 time as an age, "-" when absent or unreadable.
func ageOf(now time.Time, rfc3339 string) string {
	t, err := time.Parse(time.RFC3339Nano, rfc3339)
	if err != nil {
		return "-"
	}
	return age(now, t)
}
