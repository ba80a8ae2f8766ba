// Command consolebundle bundles the web console's scripts and styles
// (internal/console/web: app.js, its CSS and the npm packages it imports)
// into internal/console/dist, which the aenv binary embeds. `make build`
// runs it after `npm ci` in the web directory. It is a module of its own so
// that the bundler stays out of aenv's dependencies.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/evanw/esbuild/pkg/api"
)

func main() {
	src := flag.String("src", "", "the console's web directory (app.js, node_modules)")
	out := flag.String("out", "", "where app.js and app.css are written")
	flag.Parse()
	if *src == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: consolebundle -src DIR -out DIR")
		os.Exit(2)
	}
	res := api.Build(api.BuildOptions{
		EntryPoints:       []string{filepath.Join(*src, "app.js")},
		AbsWorkingDir:     *src,
		Outdir:            *out,
		Bundle:            true,
		Write:             true,
		Format:            api.FormatIIFE,
		Target:            api.ES2020,
		MinifyWhitespace:  true,
		MinifySyntax:      true,
		MinifyIdentifiers: true,
		// The same input gives the same bundle: no build time, no paths of
		// the machine.
		LegalComments: api.LegalCommentsEndOfFile,
		LogLevel:      api.LogLevelWarning,
	})
	if len(res.Errors) > 0 {
		fmt.Fprintf(os.Stderr, "consolebundle: %d errors\n", len(res.Errors))
		os.Exit(1)
	}
	for _, f := range res.OutputFiles {
		fmt.Printf("consolebundle: %s (%d KiB)\n", f.Path, len(f.Contents)>>10)
	}
}
