package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// BenchmarkConsole measures the web console in headless Chromium against
// a server holding $AENV_BENCH_CONSOLE_SANDBOXES sandboxes (default 50;
// past 40, the others are paused to disk as they are made: the test
// harness gives a server a /24, which holds 64 running sandboxes, and a
// sandbox paused to disk holds no slot and no memory; the list shows 100
// a page):
//   - page load: from navigation to the sandbox list drawn, logged in
//     (the shell, the bundle, who the key is, the first page of the list);
//   - terminal echo: from a key reaching the page to its echo drawn in the
//     terminal (the key goes to envd by SendInput, the echo comes back on
//     the PTY's stream), p50 and p99 of 50 keys, and the p50 of its parts
//     (to the SendInput call, the call, its answer to the echo drawn) by
//     the browser's resource timing.
//
// make bench-console runs it.
func BenchmarkConsole(b *testing.B) {
	const consoleRunning = 40
	n := 50
	if v := os.Getenv("AENV_BENCH_CONSOLE_SANDBOXES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("AENV_BENCH_CONSOLE_SANDBOXES=%q: want a count", v)
		}
	}
	s := newServer(b)
	s.start()
	e := newEndpoint(b, s.url)
	ids := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			var sb struct {
				SandboxID string `json:"sandboxID"`
			}
			e.want(201, apiKey, "POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 3600,
				"memoryMB": 256}).json(b, &sb)
			ids[i] = sb.SandboxID
			if i >= consoleRunning {
				e.want(204, apiKey, "POST", "/sandboxes/"+sb.SandboxID+"/pause", map[string]any{"toDisk": true})
			}
		}()
	}
	wg.Wait()

	ctx := newBrowser(b)
	run := func(what string, a chromedp.Action[chromedp.Void]) {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if err := chromedp.Do(sctx, a); err != nil {
			b.Fatalf("%s: %v", what, err)
		}
	}
	run("log in", chromedp.Steps(chromedp.Navigate(s.url+"/console/"),
		chromedp.SendKeys(chromedp.CSS(`input[data-test=key]`), apiKey),
		chromedp.Click(chromedp.CSS(`button[data-test=login]`)),
		chromedp.WaitVisible(chromedp.CSS(`a[data-test=sandbox-link]`))))

	var loads []time.Duration
	for range b.N {
		// A new document each time (not a change of the fragment), so that
		// performance.now() counts from this load's start.
		run("navigate", chromedp.Steps(chromedp.Navigate("about:blank"), chromedp.Navigate(s.url+"/console/#/sandboxes")))
		// A poll can start in the document the navigation is replacing
		// ("Cannot find context"): it is asked again in the new one.
		var ms float64
		var err error
		for try := 0; try < 3; try++ {
			ms, err = chromedp.Run(ctx, chromedp.Poll[float64](
				`document.querySelectorAll("a[data-test=sandbox-link]").length > 0 && performance.now()`,
				chromedp.WithPollingTimeout(time.Minute)))
			if err == nil || !strings.Contains(err.Error(), "Cannot find context") {
				break
			}
		}
		if err != nil {
			b.Fatal(err)
		}
		loads = append(loads, msDuration(ms))
	}

	run("open a sandbox", chromedp.Steps(chromedp.Navigate(s.url+"/console/#/sandboxes/"+ids[0]),
		chromedp.Click(chromedp.CSS(`button[data-test=open-terminal]`)),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Poll[chromedp.Void](`(document.querySelector("[data-test=terminal-status]") || {}).textContent.startsWith("connected")`,
				chromedp.WithPollingTimeout(time.Minute))(ctx, tg)
			return err
		})))
	// The shell's prompt first, then keys one at a time: each is timed from
	// its keydown in the page to its echo drawn.
	run("focus the terminal", chromedp.Steps(chromedp.Click(chromedp.CSS(`.xterm-screen`)),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Poll[chromedp.Void](`document.querySelector(".xterm-rows").textContent.includes("$")`,
				chromedp.WithPollingTimeout(time.Minute))(ctx, tg)
			return err
		})))
	var echoes, toCall, call, after []time.Duration
	for i := range 50 {
		key := string(rune('a' + i%26))
		_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`(() => {
			const rows = document.querySelector(".xterm-rows");
			const before = (rows.textContent.match(/%[1]s/g) || []).length;
			window.__echo = new Promise((resolve) => {
				let sent = 0;
				document.addEventListener("keydown", () => { sent = performance.now(); }, {capture: true, once: true});
				const obs = new MutationObserver(() => {
					if ((rows.textContent.match(/%[1]s/g) || []).length > before) {
						obs.disconnect();
						const drawn = performance.now();
						// Where the time went: the key's SendInput call, as
						// the browser's resource timing saw it.
						const call = performance.getEntriesByType("resource").filter((e) => e.name.includes("SendInput")).pop();
						resolve(call && call.startTime >= sent
							? [drawn - sent, call.startTime - sent, call.responseEnd - call.startTime, drawn - call.responseEnd]
							: [drawn - sent, -1, -1, -1]);
					}
				});
				obs.observe(rows, {subtree: true, childList: true, characterData: true});
			});
			return true;
		})()`, key)))
		if err != nil {
			b.Fatal(err)
		}
		run("type", typeText(key))
		ms, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`window.__echo`, chromedp.EvalAwaitPromise))
		if err != nil {
			b.Fatal(err)
		}
		echoes = append(echoes, msDuration(ms[0]))
		if ms[1] >= 0 {
			toCall, call, after = append(toCall, msDuration(ms[1])), append(call, msDuration(ms[2])), append(after, msDuration(ms[3]))
		}
	}
	if len(call) > 0 {
		p := func(d []time.Duration) float64 { p50, _ := percentiles(d); return p50 }
		b.Logf("terminal echo, p50 of its parts (%d keys): keydown to the SendInput call %.1f ms, the call %.1f ms, "+
			"its answer to the echo drawn %.1f ms", len(call), p(toCall), p(call), p(after))
	}
	loadP50, _ := percentiles(loads)
	echoP50, echoP99 := percentiles(echoes)
	b.ReportMetric(loadP50, "load-p50-ms")
	b.ReportMetric(echoP50, "echo-p50-ms")
	b.ReportMetric(echoP99, "echo-p99-ms")
	b.Logf("console with %d sandboxes: page load p50 %.0f ms (%d loads); terminal echo p50 %.1f ms, p99 %.1f ms (%d keys)",
		n, loadP50, len(loads), echoP50, echoP99, len(echoes))
}

// msDuration is a time the page measured, in milliseconds.
func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }
