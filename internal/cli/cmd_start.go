package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/aenv-dev/aenv/internal/client"
	envdclient "github.com/aenv-dev/aenv/internal/envd/client"
)

type startFlags struct {
	server      serverFlags
	out         outputFlag
	detach      bool
	remove      bool
	timeoutSecs int
	cpus        int
	memoryMB    int
	env         []string
	metadata    []string
	volumes     []string
}

func (a *app) startCommand() *cobra.Command {
	var f startFlags
	cmd := &cobra.Command{
		Use:   "start TEMPLATE",
		Short: "Start a sandbox from a template or snapshot, and open a shell in it",
		Long: `Create a sandbox from TEMPLATE (a template ID or name, or a snapshot name) and
open an interactive login shell in it: a real terminal, so colours, Ctrl-C and
window resizes work. Leaving the shell ends the session; the sandbox keeps
running until its timeout unless --rm is given.

--detach prints the new sandbox's ID (or, with -o json, the server's answer)
and returns at once.

-v VOLUME:/path mounts a volume (aenv volume create) at /path; add :ro to
mount it read-only. The volume outlives the sandbox.`,
		Example: `  aenv start ubuntu
  aenv start ubuntu --detach
  aenv start python312 -d --timeout 3600 --cpus 4 --memory 4096 -e KEY=value
  aenv start base -d -v datasets:/mnt/data:ro -v work:/home/user/work`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			return a.runStart(cmd.Context(), f, argv[0])
		},
	}
	addServerFlags(cmd, &f.server)
	addOutputFlag(cmd, &f.out)
	flags := cmd.Flags()
	flags.BoolVarP(&f.detach, "detach", "d", false, "print the sandbox ID instead of opening a shell")
	flags.BoolVar(&f.remove, "rm", false, "delete the sandbox when the shell ends")
	flags.IntVar(&f.timeoutSecs, "timeout", 0, "lifetime in seconds (default: the server's)")
	flags.IntVar(&f.cpus, "cpus", 0, "vCPUs (default: the template's)")
	flags.IntVar(&f.memoryMB, "memory", 0, "memory in MiB (default: the template's)")
	flags.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE for all processes (repeatable)")
	flags.StringArrayVar(&f.metadata, "metadata", nil, "metadata KEY=VALUE (repeatable)")
	flags.StringArrayVarP(&f.volumes, "volume", "v", nil, "mount volume NAME at an absolute PATH: NAME:PATH[:ro] (repeatable)")
	return cmd
}

func (a *app) runStart(ctx context.Context, f startFlags, templateID string) error {
	asJSON, err := f.out.json()
	if err != nil {
		return err
	}
	if asJSON && !f.detach {
		return usageError{errors.New("-o json needs --detach")}
	}
	if f.remove && f.detach {
		return usageError{errors.New("--rm and --detach exclude each other")}
	}
	envs, err := parseKeyValues("env", f.env)
	if err != nil {
		return err
	}
	metadata, err := parseKeyValues("metadata", f.metadata)
	if err != nil {
		return err
	}
	mounts, err := parseVolumeMounts(f.volumes)
	if err != nil {
		return err
	}
	c, err := a.client(f.server)
	if err != nil {
		return err
	}
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{TemplateID: templateID, VCPU: f.cpus,
		MemoryMB: f.memoryMB, Timeout: f.timeoutSecs, Metadata: metadata, EnvVars: envs, VolumeMounts: mounts})
	if err != nil {
		return templateContext(templateID, err)
	}
	if f.detach {
		if asJSON {
			return writeJSON(a.stdout, sb.Raw)
		}
		fmt.Fprintln(a.stdout, sb.SandboxID)
		return nil
	}
	fmt.Fprintf(a.stderr, "sandbox %s started from %s\n", sb.SandboxID, templateID)
	code, err := a.runRemote(ctx, c.Envd(sb.SandboxID, sb.EnvdAccessToken),
		envdclient.ProcessSpec{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, PTY: &envdclient.PTYSize{}})
	if f.remove {
		if derr := c.DeleteSandbox(context.WithoutCancel(ctx), sb.SandboxID); derr != nil && err == nil {
			err = derr
		}
	} else {
		fmt.Fprintf(a.stderr, "sandbox %s is still running (aenv delete %s removes it)\n", sb.SandboxID, sb.SandboxID)
	}
	if err != nil {
		return err
	}
	if code != 0 {
		return exitStatus{code}
	}
	return nil
}

// parseVolumeMounts reads -v flags: NAME:PATH or NAME:PATH:ro.
func parseVolumeMounts(flags []string) ([]client.VolumeMount, error) {
	var out []client.VolumeMount
	for _, f := range flags {
		parts := strings.Split(f, ":")
		m := client.VolumeMount{}
		switch {
		case len(parts) == 2:
		case len(parts) == 3 && parts[2] == "ro":
			m.ReadOnly = true
		case len(parts) == 3 && parts[2] == "rw":
		default:
			return nil, usageError{fmt.Errorf("-v %q: want VOLUME:/path or VOLUME:/path:ro", f)}
		}
		m.Name, m.Path = parts[0], parts[1]
		if m.Name == "" || !strings.HasPrefix(m.Path, "/") {
			return nil, usageError{fmt.Errorf("-v %q: want a volume name and an absolute path, VOLUME:/path[:ro]", f)}
		}
		out = append(out, m)
	}
	return out, nil
}
