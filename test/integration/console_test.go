package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
)

// The web console in a real browser: headless Chromium (Debian's
// chromium, which scripts/install-deps.sh installs) driven over the
// DevTools protocol. It logs in with a team's key, sees that team's
// sandbox appear (and not another team's), shows hostile metadata as
// text, runs `echo` in the sandbox's terminal and reads the answer from
// the page, lists files, kills the sandbox and sees it go, logs out, and
// is logged out by the key's revocation. Screenshots go to
// $AENV_TEST_ARTIFACTS (default: the temporary directory's
// aenv-test-artifacts).

func TestConsoleSingleServer(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.start()
	driveConsole(t, newEndpoint(t, s.url), "single")
}

func TestConsoleThroughGateway(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.addNode("n1")
	g := c.addGateway()
	driveConsole(t, newEndpoint(t, g.url), "gateway")
}

// xssMetadata would run script if the console ever put a value into the
// page as markup.
const xssMetadata = `<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>`

func driveConsole(t *testing.T, e endpoint, name string) {
	teamKey, keyID := e.makeTeam("console")
	// Another team's sandbox: the console of "console" must never list it.
	var other struct {
		SandboxID string `json:"sandboxID"`
	}
	e.want(201, apiKey, "POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 600}).json(t, &other)
	var own struct {
		SandboxID string `json:"sandboxID"`
	}
	e.want(201, teamKey, "POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 600,
		"metadata": map[string]string{"note": xssMetadata},
		"network":  map[string]any{"allowOut": []string{"console.test"}, "denyOut": []string{"0.0.0.0/0"}}}).json(t, &own)
	// A connection its policy refuses, for the page's egress log: the node's
	// gateway reads the Host and answers 403 without reaching anything.
	e.want(200, teamKey, "POST", "/sandboxes/"+own.SandboxID+"/execute",
		map[string]any{"command": "curl -s -m 10 -H 'Host: blocked.test' http://192.0.2.1/"})
	// A build of the team's, whose log the templates page shows.
	var build struct {
		BuildID string `json:"buildID"`
	}
	e.want(202, teamKey, "POST", "/v3/templates", map[string]any{"name": "console-app"}).json(t, &build)
	e.want(202, teamKey, "POST", "/v2/templates/console-app/builds/"+build.BuildID, map[string]any{
		"fromTemplate": "base", "steps": []map[string]any{{"type": "RUN", "args": []string{"echo built-for-the-$((6*7))-console"}}}})
	t.Cleanup(func() {
		e.call(apiKey, "DELETE", "/templates/console-app", nil)
		e.call(apiKey, "DELETE", "/sandboxes/"+other.SandboxID, nil)
		e.call(apiKey, "DELETE", "/sandboxes/"+own.SandboxID, nil) // gone already when the test passed
	})

	ctx := newBrowser(t)
	artifacts := artifactDir(t, name)
	shot := func(what string) {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Logf("screenshot %s: %v", what, err)
			return
		}
		p := filepath.Join(artifacts, what+".png")
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", p)
	}
	// step runs browser actions with a bound, failing with a screenshot.
	step := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		if err := chromedp.Do(sctx, actions...); err != nil {
			shot("failed-" + strings.ReplaceAll(what, " ", "-"))
			t.Fatalf("%s: %v", what, err)
		}
	}
	poll := func(what, expr string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(100*time.Millisecond),
				chromedp.WithPollingTimeout(60*time.Second))(ctx, tg)
			if err != nil {
				return fmt.Errorf("waiting for %s: %w", what, err)
			}
			return nil
		})
	}
	// eval runs a script of the page, bounded.
	eval := func(expr string, opts ...chromedp.EvaluateOption) any {
		t.Helper()
		ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		v, err := chromedp.Run(ectx, chromedp.Evaluate[any](expr, opts...))
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		return v
	}
	text := func(sel string) string {
		return fmt.Sprintf(`(document.querySelector(%q) || {}).textContent || ""`, sel)
	}
	login := func(key string) chromedp.Action[chromedp.Void] {
		return chromedp.Steps(
			chromedp.WaitVisible(chromedp.CSS(`input[data-test=key]`)),
			setValue(`input[data-test=key]`, ""),
			chromedp.SendKeys(chromedp.CSS(`input[data-test=key]`), key),
			chromedp.Click(chromedp.CSS(`button[data-test=login]`)))
	}
	ownRow := fmt.Sprintf(`tr[data-test="sandbox-%s"]`, own.SandboxID)
	otherRow := fmt.Sprintf(`tr[data-test="sandbox-%s"]`, other.SandboxID)

	start := time.Now()
	step("open the console", chromedp.Navigate(e.url+"/console/"), chromedp.WaitVisible(chromedp.CSS(`input[data-test=key]`)))
	t.Logf("login page shown in %v", time.Since(start))
	step("refuse a wrong key", login("aenv_not_a_key_at_all"),
		poll("the login error", text(`[data-test=login-error]`)+`.includes("Not logged in")`))
	step("log in", login(teamKey), poll("who is logged in", text(`[data-test=who]`)+`.includes("team console")`))
	step("see the team's sandbox", poll("its row", fmt.Sprintf(`document.querySelector(%q) !== null`, ownRow)))
	if present := eval(fmt.Sprintf(`document.querySelector(%q) !== null`, otherRow)); present != false {
		t.Fatalf("another team's sandbox listed: %v", present)
	}
	// The metadata is shown as the text it is, and ran nothing.
	if shown := eval(text(ownRow + ` [data-test=metadata]`)); shown != "note="+xssMetadata {
		t.Fatalf("metadata shown as %q, want the text %q", shown, "note="+xssMetadata)
	}
	if injected := eval(fmt.Sprintf(`window.__xss !== undefined || document.querySelector(%q) !== null`,
		ownRow+` img, `+ownRow+` script`)); injected != false {
		t.Fatalf("metadata became markup or script: %v", injected)
	}
	// The list samples its running sandboxes' metrics in one call; two
	// readings (taken 5 s apart) make a sparkline.
	step("see its CPU over time", poll("its sparkline", fmt.Sprintf(`document.querySelector(%q) !== null`,
		ownRow+` [data-test=cpu] svg.sparkline`)))
	shot("sandboxes")

	step("open the sandbox", clickJS(ownRow+` a[data-test=sandbox-link]`, 1),
		poll("its page", text(`[data-test=state]`)+` === "running"`))
	step("see its egress", poll("the policy", text(`[data-test=egress-policy]`)+` === "allow console.test; deny 0.0.0.0/0"`),
		poll("the refused connection", text(`[data-test=egress-log] tr[data-test=egress-denied]`)+`.includes("blocked.test is not in allowOut")`))
	step("open its terminal", clickJS(`button[data-test=open-terminal]`, 1),
		poll("the terminal connected", text(`[data-test=terminal-status]`)+`.startsWith("connected")`))
	// The shell computes the answer, so the echo of what was typed cannot
	// pass for it.
	typed := time.Now()
	// A user clicks into the terminal to type.
	step("focus the terminal", chromedp.Click(chromedp.CSS(`.xterm-screen`)),
		poll("the terminal focused", `document.activeElement && document.activeElement.classList.contains("xterm-helper-textarea")`))
	step("run echo in the terminal", typeText("echo hi-$((6*7))\r"),
		poll("the answer in the terminal", `[...document.querySelectorAll(".xterm-rows > div")].some(r => r.textContent.trim() === "hi-42")`))
	t.Logf("terminal: typed to answer shown in %v", time.Since(typed))
	t.Logf("terminal:\n%s", eval(`[...document.querySelectorAll(".xterm-rows > div")].map(r => r.textContent.trimEnd()).filter(l => l).join("\n")`))
	step("list files", setValue(`input[data-test=files-path]`, "/"),
		clickJS(`button[data-test=files-list]`, 1),
		poll("/etc in the list", `[...document.querySelectorAll("table a")].some(a => a.textContent === "etc/")`))
	// The terminal's shell was a process envd started: the log says so
	// (refreshed with the metrics, every 5 s).
	step("see its log", poll("the terminal's start in the log",
		`[...document.querySelectorAll("[data-test=sandbox-log] tr[data-test=log-info]")].some(r => r.textContent.includes("process started"))`))
	shot("sandbox")

	// Two clicks at once: the first arms the button, the second confirms
	// (a refresh in between cannot disarm it).
	step("kill it", clickJS(`button[data-test=kill]`, 2),
		poll("it is gone", text(`[data-test=state]`)+` === "gone"`))
	waitFor(t, time.Minute, "the sandbox gone from the API", func() bool {
		return e.call(teamKey, "GET", "/sandboxes/"+own.SandboxID, nil).status == 404
	})
	step("see it go from the list", chromedp.Navigate(e.url+"/console/#/sandboxes"),
		poll("the list drawn without its row", fmt.Sprintf(`(document.querySelector("main h2") || {}).textContent === "Sandboxes" &&
			document.querySelector("main table") !== null && document.querySelector(%q) === null`, ownRow)))

	// The build's log, once it is done (the page lists templates, and a
	// first build makes its template at its end).
	waitFor(t, 3*time.Minute, "the team's build to end", func() bool {
		var st struct {
			Status string `json:"status"`
		}
		e.want(200, teamKey, "GET", "/templates/console-app/builds/"+build.BuildID+"/status", nil).json(t, &st)
		if st.Status == "error" {
			t.Fatalf("the console's build failed: %s", e.call(teamKey, "GET", "/templates/console-app/builds/"+build.BuildID+"/status", nil).body)
		}
		return st.Status == "ready"
	})
	appRow := `tr[data-test="template-console-app"]`
	step("see the build's log", chromedp.Navigate(e.url+"/console/#/templates"),
		poll("the template's row", fmt.Sprintf(`document.querySelector(%q) !== null`, appRow)),
		clickJS(appRow+` button[data-test=build-log-open]`, 1),
		poll("the step's output in the log", text(`[data-test=build-log-lines]`)+`.includes("built-for-the-42-console")`),
		poll("the build ready", text(`[data-test=build-status]`)+` === "ready"`))
	shot("build-log")

	step("log out", chromedp.Click(chromedp.CSS(`button[data-test=logout]`)),
		chromedp.WaitVisible(chromedp.CSS(`input[data-test=key]`)))
	if status := eval(`fetch("/console/api/v2/sandboxes", {headers: {"X-Aenv-Console": "1"}}).then(r => r.status)`,
		chromedp.EvalAwaitPromise); status != float64(401) {
		t.Fatalf("after logout the console's API answered %v, want 401", status)
	}
	// A page of the console cannot call the API without the console's
	// header (what a forged cross-site request lacks).
	step("log in again", login(teamKey), poll("logged in", text(`[data-test=who]`)+`.includes("team console")`))
	if status := eval(`fetch("/console/api/v2/sandboxes").then(r => r.status)`, chromedp.EvalAwaitPromise); status != float64(403) {
		t.Fatalf("a call without the console's header answered %v, want 403", status)
	}
	// Revoking the key ends the session: the list's next refresh is
	// refused and the login page comes back.
	e.want(204, apiKey, "DELETE", "/api-keys/"+keyID, nil)
	step("logged out by the key's revocation", chromedp.WaitVisible(chromedp.CSS(`input[data-test=key]`)))
	shot("revoked")
}

// newBrowser starts a headless Chromium for the test, with its own
// profile and HOME, stopped at the test's end.
func newBrowser(t testing.TB) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is not installed (scripts/install-deps.sh installs it):", err)
	}
	home := t.TempDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(filepath.Join(home, "profile")),
		chromedp.Env("HOME="+home, "XDG_CONFIG_HOME="+home, "XDG_CACHE_HOME="+home),
		chromedp.WindowSize(1280, 1000),
		// As root, Chromium runs only without its own sandbox.
		chromedp.NoSandbox,
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The first run starts the browser; its context is the browser's, so
	// it is bounded from outside rather than by a deadline of its own.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx) }()
	select {
	case err := <-started:
		if err != nil {
			t.Fatal("start chromium:", err)
		}
	case <-time.After(2 * time.Minute):
		cancel()
		t.Fatal("chromium did not start in 2 minutes")
	}
	return ctx
}

func artifactDir(t testing.TB, name string) string {
	base := os.Getenv("AENV_TEST_ARTIFACTS")
	if base == "" {
		base = filepath.Join(os.TempDir(), "aenv-test-artifacts")
	}
	dir := filepath.Join(base, "console-"+name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// setValue sets an input's value as a script of the page would.
func setValue(sel, value string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Evaluate[bool](fmt.Sprintf(`(() => { const e = document.querySelector(%q); e.value = %q; return true; })()`,
			sel, value))(ctx, tg)
		return err
	})
}

// typeText types text into the focused element a key at a time, as a
// keyboard does: a keydown that carries the character (the browser makes
// its keypress and input events) and a keyup. "\r" is the Enter key.
func typeText(text string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		for _, r := range text {
			down := input.DispatchKeyEventParams{Type: input.DispatchKeyEventTypeKeyDown, Text: string(r), UnmodifiedText: string(r), Key: string(r)}
			if r == '\r' {
				down.Key, down.Code, down.WindowsVirtualKeyCode = "Enter", "Enter", 13
			}
			up := down
			up.Type, up.Text, up.UnmodifiedText = input.DispatchKeyEventTypeKeyUp, "", ""
			for _, ev := range []input.DispatchKeyEventParams{down, up} {
				if _, err := cdp.Call(ctx, tg, input.DispatchKeyEvent, ev); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// clickJS waits for the element sel and clicks it n times in one script,
// as a user would: a list redrawn every few seconds cannot replace it
// between finding and clicking.
func clickJS(sel string, n int) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Poll[bool](fmt.Sprintf(`(() => {
			const e = document.querySelector(%q);
			if (!e) return false;
			for (let i = 0; i < %d; i++) e.click();
			return true;
		})()`, sel, n), chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(60*time.Second))(ctx, tg)
		if err != nil {
			return fmt.Errorf("click %s: %w", sel, err)
		}
		return nil
	})
}
