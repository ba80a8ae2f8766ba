package cli

import (
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func walk(cmd *cobra.Command, fn func(*cobra.Command)) {
	fn(cmd)
	for _, c := range cmd.Commands() {
		walk(c, fn)
	}
}

func testRoot() *cobra.Command {
	return newRoot(newApp(strings.NewReader(""), io.Discard, io.Discard, func(string) string { return "" }))
}

// isClientCommand tells commands that talk to a server from the server
// itself, version, completion and groups.
func isClientCommand(cmd *cobra.Command) bool {
	for c := cmd; c != nil; c = c.Parent() {
		switch c.Name() {
		case "server", "gateway", "ca", "admin", "version", "completion", "help":
			return false
		}
	}
	return cmd.HasParent() && !cmd.HasSubCommands()
}

func TestEveryCommandIsDocumented(t *testing.T) {
	walk(testRoot(), func(cmd *cobra.Command) {
		if cmd.Short == "" || cmd.Long == "" {
			t.Errorf("%q: Short and Long help are required", cmd.CommandPath())
		}
		if cmd.Runnable() && cmd.Args == nil && !strings.HasPrefix(cmd.CommandPath(), "aenv completion") && cmd.HasParent() {
			t.Errorf("%q: no positional-argument check", cmd.CommandPath())
		}
	})
}

func TestListAndCreateCommandsTakeJSONOutput(t *testing.T) {
	want := []string{"aenv audit", "aenv build", "aenv cluster status", "aenv egress", "aenv fork", "aenv key create", "aenv key ls", "aenv logs", "aenv ls", "aenv pull", "aenv run-code",
		"aenv secret create", "aenv secret inspect", "aenv secret ls", "aenv secret update", "aenv snapshot create", "aenv snapshot fork", "aenv snapshot inspect", "aenv snapshot ls", "aenv start", "aenv team create", "aenv team ls", "aenv template ls", "aenv usage", "aenv volume create", "aenv volume inspect", "aenv volume ls", "aenv volume move"}
	var got []string
	walk(testRoot(), func(cmd *cobra.Command) {
		if cmd.Annotations[annotationOutput] == "" {
			return
		}
		got = append(got, cmd.CommandPath())
		f := cmd.Flags().Lookup("output")
		if f == nil || f.Shorthand != "o" {
			t.Errorf("%q: marked as listing or creating but has no -o/--output", cmd.CommandPath())
		}
	})
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("commands with -o json: %v, want %v", got, want)
	}
}

func TestClientCommandsTakeServerFlags(t *testing.T) {
	n := 0
	walk(testRoot(), func(cmd *cobra.Command) {
		if !isClientCommand(cmd) {
			return
		}
		n++
		for _, name := range []string{"url", "api-key"} {
			if cmd.Flags().Lookup(name) == nil {
				t.Errorf("%q: no --%s", cmd.CommandPath(), name)
			}
		}
	})
	if n < 15 {
		t.Errorf("found %d client commands; the walk is broken", n)
	}
}

func TestIssueVerbsExist(t *testing.T) {
	root := testRoot()
	for _, path := range [][]string{
		{"auth"}, {"pull"}, {"build"}, {"template", "ls"}, {"template", "rm"}, {"start"}, {"ls"}, {"exec"}, {"cp"},
		{"pause"}, {"resume"}, {"timeout"}, {"delete"}, {"fork"}, {"snapshot", "create"}, {"snapshot", "ls"},
		{"snapshot", "rm"}, {"completion", "bash"}, {"completion", "zsh"}, {"server"}, {"version"},
		{"node"}, {"node", "drain"}, {"node", "undrain"}, {"node", "rm"}, {"gateway"}, {"cluster", "status"},
	} {
		cmd, rest, err := root.Find(path)
		if err != nil || len(rest) != 0 || cmd.Name() != path[len(path)-1] {
			t.Errorf("aenv %s: not found (%v)", strings.Join(path, " "), err)
		}
	}
}
