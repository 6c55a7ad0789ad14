package server

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/offenders"
)

var update = flag.Bool("update", false, "rewrite docs/images/live-page.png from the live page test")

// browser opens url in headless Chromium; it skips when Chromium is
// missing, unless CHARON_REQUIRE_BROWSER is set.
func browser(t *testing.T, url string, width, height int) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CHARON_REQUIRE_BROWSER") != "" {
			t.Fatal("chromium not found and CHARON_REQUIRE_BROWSER is set")
		}
		t.Skip("chromium not found (apt-get install chromium)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.WindowSize(width, height), chromedp.UserDataDir(t.TempDir()))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	ctx, cancelT := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() { cancelT(); cancelC(); cancelA() })
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("navigate: %v", err)
	}
	return ctx
}

func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// waitJS waits until expr is true in the page.
func waitJS(t *testing.T, ctx context.Context, expr string) {
	t.Helper()
	eval[bool](t, ctx, `new Promise(r => { const f = () => (`+expr+`) ? r(true) : setTimeout(f, 20); f() })`)
}

// TestLivePage: the page opens on the rule with the most rejections, shows
// its three heavy tenants (among a thousand light ones) at the top with a
// link to their explain, draws the chart, lists every rule with its rates,
// switches rule on a click, and fits a phone's width.
func TestLivePage(t *testing.T) {
	// An epoch of an hour: the observations stay in view however long the
	// browser takes to start (the default minute would rotate them out).
	top := offenders.NewTracker(offenders.Options{Epoch: time.Hour})
	s, stop := newTestServer(t, Options{Top: top})
	defer stop()
	tenants := &descriptors.Limit{File: "api.yaml", Line: 12, Name: "per-tenant"}
	users := &descriptors.Limit{File: "api.yaml", Line: 4}
	now := time.Now()
	for i := range 20000 {
		// Spread over the last two minutes, so that the chart has a shape.
		at := now.Add(-time.Duration(20000-i) * 6 * time.Millisecond)
		v := "light-" + strconv.Itoa(i%1000)
		top.Observe(at, "api", tenants, "api/tenant", v, []descriptors.Entry{{Key: "tenant", Value: v}}, 1, offenders.Granted)
		if i%4 == 0 {
			for h, w := range []uint64{5, 3, 2} {
				v := "heavy-" + strconv.Itoa(h+1)
				top.Observe(at, "api", tenants, "api/tenant", v, []descriptors.Entry{{Key: "tenant", Value: v}}, w, offenders.Rejected)
			}
			top.Observe(at, "api", users, "api/user", "bob", []descriptors.Entry{{Key: "user", Value: "bob"}}, 1, offenders.Rejected)
			top.Observe(at, "api", tenants, "api/tenant", "shadowy", []descriptors.Entry{{Key: "tenant", Value: "shadowy"}}, 1, offenders.Shadow)
		}
	}
	ctx := browser(t, "http://"+s.DebugAddr()+"/ui/", 1280, 800)
	waitJS(t, ctx, `window.charonUI && window.charonUI.ready && document.querySelectorAll("#rejected tbody tr").length > 0`)
	if e := eval[string](t, ctx, `window.charonUI.error`); e != "" {
		t.Fatalf("the page reports %s", e)
	}
	if got := eval[string](t, ctx, `window.charonUI.selected`); got != "api api.yaml:12" {
		t.Errorf("selected %q, want the rule with the most rejections, api api.yaml:12", got)
	}
	got := eval[[]string](t, ctx, `[...document.querySelectorAll("#rejected tbody tr")].slice(0, 3).map(r => r.cells[0].textContent)`)
	if diff := cmp.Diff([]string{"heavy-1", "heavy-2", "heavy-3"}, got); diff != "" {
		t.Errorf("most rejected (-want +got):\n%s", diff)
	}
	href := eval[string](t, ctx, `document.querySelector("#rejected tbody tr a").href`)
	if want := "http://" + s.DebugAddr() + "/explain?domain=api&descriptor=tenant%3Dheavy-1"; href != want {
		t.Errorf("explain link %q, want %q", href, want)
	}
	body, code := get(t, href)
	if code != 501 && code != 200 {
		// The test server's fake engine cannot explain (501); a real one answers.
		t.Errorf("GET %s: %d %s", href, code, body)
	}
	rules := eval[[]string](t, ctx, `[...document.querySelectorAll("#rules tbody tr")].map(r => r.cells[0].textContent)`)
	if diff := cmp.Diff([]string{"api api.yaml:12 per-tenant", "api api.yaml:4"}, rules); diff != "" {
		t.Errorf("rules (-want +got):\n%s", diff)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("#chart polyline").length`); n != 3 {
		t.Errorf("%d chart lines, want 3 (granted, rejected, shadow)", n)
	}
	if pts := eval[int](t, ctx, `document.querySelector("#chart polyline.rejected").points.numberOfItems`); pts != offenders.Steps-1 {
		t.Errorf("rejected line of %d points, want %d", pts, offenders.Steps-1)
	}
	if *update {
		// Quality 100 is PNG; less would be JPEG.
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile("../docs/images/live-page.png", png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := chromedp.Do(ctx, chromedp.Click(`#rules tbody tr:nth-child(2)`)); err != nil {
		t.Fatal(err)
	}
	if got := eval[string](t, ctx, `document.querySelector("#rejected tbody tr").cells[0].textContent`); got != "bob" {
		t.Errorf("after a click on api.yaml:4, most rejected %q, want bob", got)
	}

	// A phone's width: nothing wider than the screen.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(390, 844)); err != nil {
		t.Fatal(err)
	}
	if w := eval[int](t, ctx, `document.documentElement.scrollWidth`); w > 390 {
		t.Errorf("at 390 px the page is %d px wide", w)
	}
	if !strings.Contains(eval[string](t, ctx, `document.title`), "limited") {
		t.Error("title")
	}
}
