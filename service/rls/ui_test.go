package rls

import (
	"context"
	"flag"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/offenders"
	"github.com/charonlimit/charon/server"
)

var update = flag.Bool("update", false, "rewrite docs/images/live-page.png and live-page-phone.png from the live page tests")

// browser opens url in headless Chromium; it skips when Chromium is
// missing, unless CHARON_REQUIRE_BROWSER is set.
func browser(t *testing.T, url string, width, height int) context.Context {
	t.Helper()
	ctx := newBrowser(t, width, height)
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("navigate: %v", err)
	}
	return ctx
}

// newBrowser is a new headless Chromium, with a profile of its own (so an
// empty session storage), on no page yet.
func newBrowser(t *testing.T, width, height int) context.Context {
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

// TestUILivePage: the page opens on the rule with the most rejections, shows
// its three heavy tenants (among a thousand light ones) at the top with a
// link to their explain, draws the chart, lists every rule with its rates,
// switches rule on a click, and fits a phone's width.
func TestUILivePage(t *testing.T) {
	// An epoch of an hour: the observations stay in view however long the
	// browser takes to start (the default minute would rotate them out).
	s, stop := newTestServer(t, withTop(Options{}, time.Hour), server.Options{})
	defer stop()
	top := s.svc.top
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
	// The link's target is the charon.v1 service's GET /explain
	// (service/charon's TestDebugExplainAndReset), which this server,
	// serving the RLS service alone, does not have.
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
		if err := os.WriteFile("../../docs/images/live-page.png", png, 0o644); err != nil {
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

// TestUIPublicAssets: with a debug token, the live page's three files, and
// nothing else, are served without it, as the same bytes that are embedded
// (so they hold no data and no secret), with the page's security headers;
// every data endpoint, every other path under /ui/ and every other method
// still answers 401. Without the live page (--top-k 0), /ui/ is refused too.
func TestUIPublicAssets(t *testing.T) {
	if diff := cmp.Diff(map[string]bool{"/ui/": true, "/ui/ui.css": true, "/ui/ui.js": true}, uiPublic); diff != "" {
		t.Errorf("paths served without the token (-want +got):\n%s", diff)
	}
	const token = "s3cret-t0ken"
	s, stop := newTestServer(t, withTop(Options{}, time.Hour), server.Options{DebugToken: token, Pprof: true})
	s.svc.top.Observe(time.Now(), "api", &descriptors.Limit{File: "api.yaml", Line: 3}, "api/tenant", "tenant-acme",
		[]descriptors.Entry{{Key: "tenant", Value: "tenant-acme"}}, 7, offenders.Rejected)
	base := "http://" + s.DebugAddr()

	for path, file := range map[string]string{"/ui/": "ui/index.html", "/ui/ui.css": "ui/ui.css", "/ui/ui.js": "ui/ui.js"} {
		want, err := fs.ReadFile(uiFiles, file)
		if err != nil {
			t.Fatal(err)
		}
		for _, method := range []string{"GET", "HEAD"} {
			resp := do(t, method, base+path, "")
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s %s without the token: %d, want 200", method, path, resp.StatusCode)
			}
			if got := resp.Header.Get("Content-Security-Policy"); got != uiContentSecurity {
				t.Errorf("%s %s: Content-Security-Policy %q, want %q", method, path, got, uiContentSecurity)
			}
			if method == "GET" && resp.body != string(want) {
				t.Errorf("GET %s without the token: not the embedded %s (%d bytes, want %d)", path, file, len(resp.body), len(want))
			}
			for _, secret := range []string{token, "tenant-acme"} {
				if strings.Contains(resp.body, secret) {
					t.Errorf("%s %s holds %q", method, path, secret)
				}
			}
		}
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/"},
		{"GET", "/top"},
		{"GET", "/top?domain=api&n=5"},
		{"GET", "/explain?domain=api&descriptor=tenant=tenant-acme"},
		{"GET", "/metrics"},
		{"GET", "/rlconfig"},
		{"GET", "/debug/pprof/"},
		{"GET", "/ui"},
		{"GET", "/ui/index.html"},
		{"GET", "/ui/missing.js"},
		{"GET", "/ui/../top"},
		{"GET", "/ui//ui.js"},
		{"GET", "/UI/ui.js"},
		{"POST", "/ui/"},
		{"PUT", "/ui/ui.js"},
	} {
		resp := do(t, c.method, base+c.path, "")
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s %s without the token: %d %.80q, want 401", c.method, c.path, resp.StatusCode, resp.body)
		}
		if strings.Contains(resp.body, "tenant-acme") {
			t.Errorf("%s %s without the token tells %q", c.method, c.path, resp.body)
		}
	}
	if resp := do(t, "GET", base+"/", "wrong"); resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.body, "open /ui/") {
		t.Errorf("GET / with a wrong token: %d %q, want 401 saying where a browser goes", resp.StatusCode, resp.body)
	}
	if resp := do(t, "GET", base+"/top", token); resp.StatusCode != http.StatusOK || !strings.Contains(resp.body, "tenant-acme") {
		t.Errorf("GET /top with the token: %d %.80q, want 200 and its data", resp.StatusCode, resp.body)
	}
	stop()

	s, stop = newTestServer(t, Options{}, server.Options{DebugToken: token})
	if resp := do(t, "GET", "http://"+s.DebugAddr()+"/ui/", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /ui/ without the token nor the live page: %d, want 401", resp.StatusCode)
	}
	stop()

	// Over mutual TLS with a table, the table still governs the page's
	// files: only the token is not asked for.
	m, srvTLS := mutualTLS(t, "unused.test")
	table := parseTable(t, "clients:\n  - identity: spiffe://test/reader\n    allow: [read]\n  - identity: spiffe://test/gateway\n    allow: [rls]\n")
	s, stop = newTestServer(t, withTop(Options{}, time.Hour), server.Options{DebugToken: token, GRPCTLS: srvTLS, DebugTLS: srvTLS, Authz: table})
	defer stop()
	for _, c := range []struct {
		who, path string
		want      int
	}{
		{"reader", "/ui/ui.js", http.StatusOK},
		{"reader", "/top", http.StatusUnauthorized},
		{"gateway", "/ui/ui.js", http.StatusForbidden},
		{"gateway", "/ui/", http.StatusForbidden},
	} {
		if body, code := fetchWith(t, httpsClient(t, m, "spiffe://test/"+c.who), "GET", "https://"+s.DebugAddr()+c.path, "", ""); code != c.want {
			t.Errorf("%s GET %s without the token: %d %.80q, want %d", c.who, c.path, code, body, c.want)
		}
	}
}

// response is an HTTP response with its body read.
type response struct {
	*http.Response
	body string
}

// do makes an HTTP request, with token as a bearer token when not empty.
func do(t *testing.T, method, url, token string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	// No redirect followed: a redirect to a guarded path would hide what
	// the asked one answers.
	hc := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{resp, string(b)}
}

// observeRules feeds top three rules: one with a long name and a resource
// of one long word, as Envoy Gateway writes them, one of a tenant limit,
// one of a user limit; each granted, rejected and in shadow mode.
func observeRules(top *offenders.Tracker, now time.Time) {
	rules := []struct {
		domain, resource string
		limit            *descriptors.Limit
	}{
		{"default/eg/http", "default/eg/http/httproute/default/backend/rule/0/match/0/generic_key=httproute-default-backend-rule-0-match-0",
			&descriptors.Limit{File: "envoy-gateway-default-eg-http.yaml", Line: 120, Name: "per-tenant-and-client-address-burst"}},
		{"api", "api/tenant", &descriptors.Limit{File: "api.yaml", Line: 12, Name: "per-tenant"}},
		{"api", "api/user", &descriptors.Limit{File: "api.yaml", Line: 4}},
	}
	for i := range 600 {
		at := now.Add(-time.Duration(600-i) * 100 * time.Millisecond)
		for j, r := range rules {
			v := "value-" + strconv.Itoa(i%7)
			es := []descriptors.Entry{{Key: "k", Value: v}}
			top.Observe(at, r.domain, r.limit, r.resource, v, es, uint64(1000*(j+1)), offenders.Granted)
			top.Observe(at, r.domain, r.limit, r.resource, v, es, uint64(300*(j+1)), offenders.Rejected)
			top.Observe(at, r.domain, r.limit, r.resource, v, es, uint64(20*(j+1)), offenders.Shadow)
		}
	}
}

// layout is where the rules table's parts are, measured in the page.
type layout struct {
	Viewport, PageScrollWidth, PageClientWidth int
	Rows                                       int
	// RatesOff names the rate cells not wholly inside both the viewport
	// and the rules section, or whose text is cut.
	RatesOff []string
	// Overflowing names the table's enclosing elements that scroll
	// sideways.
	Overflowing []string
	// MinRuleWidth is the narrowest rule name cell; RateRows the rows
	// whose three rates do not share a line; Labels the rates' labels as
	// displayed (CSS generated content).
	MinRuleWidth float64
	RateRows     int
	Labels       []string
}

const measureLayout = `(() => {
  const vw = document.documentElement.clientWidth, se = document.scrollingElement;
  const sec = document.querySelector("#rules-section").getBoundingClientRect();
  const rows = [...document.querySelectorAll("#rules tbody tr")];
  const off = [], over = [], labels = [];
  let rateRows = 0;
  for (const tr of rows) {
    const cells = [...tr.querySelectorAll("td.num")];
    for (const c of cells) {
      const r = c.getBoundingClientRect();
      if (r.width === 0 || r.left < 0 || r.right > vw || r.left < sec.left || r.right > sec.right || c.scrollWidth > c.clientWidth)
        off.push(tr.dataset.key + " " + c.dataset.label + " [" + r.left + ", " + r.right + "] in [" + sec.left + ", " + sec.right + "], viewport " + vw);
    }
    if (new Set(cells.map((c) => Math.round(c.getBoundingClientRect().top))).size !== 1) rateRows++;
  }
  for (const c of rows[0].querySelectorAll("td.num")) labels.push(getComputedStyle(c, "::before").content);
  for (let e = document.querySelector("#rules"); e; e = e.parentElement)
    if (e.scrollWidth > e.clientWidth) over.push(e.tagName + (e.id ? "#" + e.id : "") + " " + e.scrollWidth + " > " + e.clientWidth);
  return { Viewport: vw, PageScrollWidth: se.scrollWidth, PageClientWidth: se.clientWidth, Rows: rows.length,
    RatesOff: off, Overflowing: over, RateRows: rateRows, Labels: labels,
    MinRuleWidth: Math.min(...rows.map((tr) => tr.cells[0].getBoundingClientRect().width)) };
})()`

// TestUILayout: at 1200 px the rules table shows every rate, one row
// per rule, with no sideways scrolling however long the rules' names; at
// 390 px (a phone) the page does not overflow, each rule is a block whose
// name spans the width and whose rates keep their labels.
func TestUILayout(t *testing.T) {
	s, stop := newTestServer(t, withTop(Options{}, time.Hour), server.Options{})
	defer stop()
	top := s.svc.top
	observeRules(top, time.Now())
	ctx := browser(t, "http://"+s.DebugAddr()+"/ui/", 1200, 900)
	waitJS(t, ctx, `window.charonUI && window.charonUI.ready && document.querySelectorAll("#rules tbody tr").length === 3`)
	for _, c := range []struct {
		width  int
		labels []string
	}{
		{1200, []string{"none", "none", "none"}},
		{390, []string{`"granted "`, `"rejected "`, `"shadow "`}},
	} {
		if err := chromedp.Do(ctx, chromedp.EmulateViewport(int64(c.width), 900)); err != nil {
			t.Fatal(err)
		}
		// Wait for the layout of the new width.
		waitJS(t, ctx, `document.documentElement.clientWidth <= `+strconv.Itoa(c.width))
		got := eval[layout](t, ctx, measureLayout)
		if got.Viewport > c.width || got.Viewport < c.width-20 {
			t.Fatalf("at %d px: the viewport is %d px wide", c.width, got.Viewport)
		}
		if got.Rows != 3 {
			t.Errorf("at %d px: %d rules, want 3", c.width, got.Rows)
		}
		if got.PageScrollWidth > got.PageClientWidth {
			t.Errorf("at %d px: the page is %d px wide in %d", c.width, got.PageScrollWidth, got.PageClientWidth)
		}
		if len(got.RatesOff) > 0 {
			t.Errorf("at %d px: rates out of view:\n%s", c.width, strings.Join(got.RatesOff, "\n"))
		}
		if len(got.Overflowing) > 0 {
			t.Errorf("at %d px: the rules table scrolls sideways in %v", c.width, got.Overflowing)
		}
		if got.RateRows != 0 {
			t.Errorf("at %d px: %d rules have their rates on more than one line", c.width, got.RateRows)
		}
		if diff := cmp.Diff(c.labels, got.Labels); diff != "" {
			t.Errorf("at %d px: rate labels (-want +got):\n%s", c.width, diff)
		}
		// A rule's name has room: 100 px at least beside its rates, the
		// whole width (less the padding) on a phone.
		minRule := 100.0
		if c.width < 600 {
			minRule = float64(got.Viewport) - 60
		}
		if got.MinRuleWidth < minRule {
			t.Errorf("at %d px: a rule name %.0f px wide, want %.0f or more", c.width, got.MinRuleWidth, minRule)
		}
		if *update && c.width < 600 {
			png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile("../../docs/images/live-page-phone.png", png, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestUIToken: on a debug port with a token, the live page asks for
// it; a wrong one brings the form back saying so; the right one loads the
// data, and a reload within the tab's session loads it without asking.
// An explain link is fetched with the token. Opened with #token=… in a new
// browser, the page takes the token from the fragment and clears it. No URL
// the browser requests holds the token; the page's requests to the data
// carry it as Authorization: Bearer.
func TestUIToken(t *testing.T) {
	const token = "t0ken-Z9"
	s, stop := newTestServer(t, withTop(Options{}, time.Hour), server.Options{DebugToken: token})
	defer stop()
	top := s.svc.top
	observeRules(top, time.Now())
	page := "http://" + s.DebugAddr() + "/ui/"

	var mu sync.Mutex
	var urls []string
	var bearers int
	record := func(ev any) {
		if ev, ok := ev.(*network.EventRequestWillBeSent); ok {
			mu.Lock()
			defer mu.Unlock()
			urls = append(urls, ev.Request.URL)
			if ev.Request.Headers["Authorization"] == "Bearer "+token && strings.Contains(ev.Request.URL, "/top?") {
				bearers++
			}
		}
	}
	const loaded = `window.charonUI && window.charonUI.ready && document.querySelectorAll("#rules tbody tr").length === 3`
	const stored = `sessionStorage.getItem("charon-debug-token") || ""`

	ctx := newBrowser(t, 1200, 900)
	if err := chromedp.Listen(ctx, record); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(page)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, `window.charonUI && window.charonUI.asked === 1 && !document.querySelector("#login").hidden`)
	if msg := eval[string](t, ctx, `document.querySelector("#login-message").textContent`); msg != "" {
		t.Errorf("first form says %q, want nothing but its heading", msg)
	}
	if !eval[bool](t, ctx, `document.querySelector("main").hidden`) {
		t.Error("the empty page shows beside the form")
	}

	submit := func(tok string) {
		t.Helper()
		if err := chromedp.Do(ctx, chromedp.SendKeys("#token", tok), chromedp.Click(`#login button[type=submit]`)); err != nil {
			t.Fatal(err)
		}
	}
	submit("wrong")
	waitJS(t, ctx, `window.charonUI.asked === 2 && !document.querySelector("#login").hidden`)
	if msg := eval[string](t, ctx, `document.querySelector("#login-message").textContent`); !strings.Contains(msg, "refused that token") {
		t.Errorf("after a wrong token the form says %q, want that the token was refused", msg)
	}
	if got := eval[string](t, ctx, stored); got != "" {
		t.Errorf("a refused token is kept: %q", got)
	}

	submit(token)
	waitJS(t, ctx, loaded)
	if !eval[bool](t, ctx, `document.querySelector("#login").hidden && !document.querySelector("main").hidden`) {
		t.Error("with the right token the form stays, or the page is hidden")
	}
	if got := eval[string](t, ctx, stored); got != token {
		t.Errorf("session storage holds %q, want the token", got)
	}

	// An explain link goes through the page, with the token. (The test
	// server's engine cannot explain: 501, a refusal would be 401.)
	if err := chromedp.Do(ctx, chromedp.Click(`#rejected tbody tr a.explain`)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, `!document.querySelector("#explanation").hidden && document.querySelector("#explanation pre").textContent !== "loading…"`)
	if got := eval[string](t, ctx, `document.querySelector("#explanation pre").textContent`); strings.HasPrefix(got, "401") || got == "" {
		t.Errorf("the explanation reads %q", got)
	}
	if eval[string](t, ctx, `location.href`) != page {
		t.Error("the explain link navigated away")
	}

	if err := chromedp.Do(ctx, chromedp.Reload()); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, loaded)
	if n := eval[int](t, ctx, `window.charonUI.asked`); n != 0 {
		t.Errorf("after a reload the form was shown %d times, want 0", n)
	}

	// Forgetting the token asks for it again.
	if err := chromedp.Do(ctx, chromedp.Click("#forget")); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, `!document.querySelector("#login").hidden`)
	if got := eval[string](t, ctx, stored); got != "" {
		t.Errorf("after forget, session storage holds %q", got)
	}

	// A new browser, the token in the fragment.
	ctx = newBrowser(t, 1200, 900)
	if err := chromedp.Listen(ctx, record); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(page+"#token="+token)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, loaded)
	if n := eval[int](t, ctx, `window.charonUI.asked`); n != 0 {
		t.Errorf("with #token the form was shown %d times, want 0", n)
	}
	if got := eval[string](t, ctx, `location.href`); got != page {
		t.Errorf("the address is %q after the fragment was read, want %q", got, page)
	}
	if got := eval[string](t, ctx, stored); got != token {
		t.Errorf("session storage holds %q, want the fragment's token", got)
	}

	mu.Lock()
	defer mu.Unlock()
	for _, u := range urls {
		if strings.Contains(u, token) {
			t.Errorf("the browser requested %s", u)
		}
	}
	if bearers == 0 {
		t.Errorf("no request to /top carried the token as a bearer token; requests: %v", urls)
	}
}
