package sim

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"io/fs"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/chromedp/chromedp"
)

// page builds the engine from the current source (whatever `go generate`
// last embedded), serves the page with it through HandlerFS, and opens it
// in headless Chromium. It skips when Chromium is missing, unless
// CHARON_REQUIRE_BROWSER is set (CI).
func page(t *testing.T) (context.Context, string) {
	t.Helper()
	browser, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CHARON_REQUIRE_BROWSER") != "" {
			t.Fatal("chromium not found and CHARON_REQUIRE_BROWSER is set")
		}
		t.Skip("chromium not found (apt-get install chromium)")
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(dir, "charon.wasm"), "./wasm")
	build.Env = append(os.Environ(), "GOOS=js", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the engine: %v\n%s", err, out)
	}
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatal(err)
	}
	files := fstest.MapFS{}
	for _, name := range []string{"index.html", "sim.js", "sim.css"} {
		b, err := fs.ReadFile(Files(), name)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = &fstest.MapFile{Data: b}
	}
	for name, path := range map[string]string{
		"charon.wasm":  filepath.Join(dir, "charon.wasm"),
		"wasm_exec.js": filepath.Join(strings.TrimSpace(string(goroot)), "lib", "wasm", "wasm_exec.js"),
	} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = &fstest.MapFile{Data: b}
	}
	srv := httptest.NewServer(HandlerFS(files))
	t.Cleanup(srv.Close)

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true), chromedp.WindowSize(1400, 1000),
		chromedp.UserDataDir(t.TempDir()))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	ctx, cancelT := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(func() { cancelT(); cancelC(); cancelA() })
	start := time.Now()
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatalf("navigate: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`new Promise(r => { const f = () => window.charonSim ? r(true) : setTimeout(f, 20); f() })`, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatalf("the page did not become ready: %v", err)
	}
	t.Logf("page ready %v after navigation (engine %d bytes)", time.Since(start).Round(time.Millisecond), len(files["charon.wasm"].Data))
	return ctx, srv.URL
}

// simState is what state() answers, in part.
type simState struct {
	Tier      int    `json:"tier"`
	Remaining int64  `json:"remaining"`
	Summary   string `json:"summary"`
	Tiers     []struct {
		Phase string `json:"phase"`
		Hits  int64  `json:"hits"`
	} `json:"tiers"`
	Last *struct {
		OK   bool `json:"ok"`
		Tier int  `json:"tier"`
	} `json:"last"`
	Compare *simState `json:"compare"`
}

func js[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// do evaluates a statement whose value does not matter.
func do(t *testing.T, ctx context.Context, expr string) {
	t.Helper()
	js[bool](t, ctx, "("+expr+", true)")
}

// grantsJS sends n single requests and counts the grants.
func grantsJS(t *testing.T, ctx context.Context, n int) int {
	t.Helper()
	return js[int](t, ctx, `(() => { let g = 0; for (let i = 0; i < `+strconv.Itoa(n)+`; i++) if (charonSim.request(1).ok) g++; return g })()`)
}

func loadPattern(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	r := js[map[string]any](t, ctx, `charonSim.load(charonSim.patterns().find(p => p.name === "`+name+`").yaml)`)
	if r["ok"] != true {
		t.Fatalf("load %s: %v", name, r)
	}
}

// TestBrowserPatterns drives the page as the seed describes each pattern,
// with the clock paused so only advance() moves time.
func TestBrowserPatterns(t *testing.T) {
	ctx, _ := page(t)
	do(t, ctx, `charonSim.setSpeed(0)`)

	loadPattern(t, ctx, "simple")
	if g := grantsJS(t, ctx, 6); g != 5 {
		t.Errorf("simple: %d of 6 granted, want 5 (the sixth within a second is rejected)", g)
	}

	loadPattern(t, ctx, "penalties")
	if g := grantsJS(t, ctx, 20); g != 15 || js[simState](t, ctx, `charonSim.state()`).Tier != 2 {
		t.Errorf("penalties: a burst granted %d, want 15 reaching tier 2", g)
	}
	do(t, ctx, `charonSim.advance(4000)`)
	if s := js[simState](t, ctx, `charonSim.state()`); s.Tier != 2 {
		t.Errorf("penalties: 4 s later tier %d, want 2 (active for 5 s)", s.Tier)
	}
	do(t, ctx, `charonSim.advance(1500)`)
	s := js[simState](t, ctx, `charonSim.state()`)
	if s.Tier != 1 || s.Tiers[1].Phase != "cooldown" || grantsJS(t, ctx, 20) != 5 {
		t.Errorf("penalties: after 5 s, tier %d (%v), want held to tier 1's 5 with tier 2 cooling down", s.Tier, s.Tiers)
	}
	do(t, ctx, `charonSim.advance(14000)`)
	if g := grantsJS(t, ctx, 20); g != 5 {
		t.Errorf("penalties: 19.5 s after the burst %d granted, want 5 (still held)", g)
	}
	do(t, ctx, `charonSim.advance(1000)`)
	if g := grantsJS(t, ctx, 20); g != 15 {
		t.Errorf("penalties: after the 15 s cooldown %d granted, want a burst of 15 again", g)
	}

	loadPattern(t, ctx, "punishment")
	if g := grantsJS(t, ctx, 30); g != 16 || js[simState](t, ctx, `charonSim.state()`).Tier != 3 {
		t.Errorf("punishment: burst granted %d, want 16 into the prison tier 3", g)
	}
	do(t, ctx, `charonSim.advance(30 * 60000)`)
	if g := grantsJS(t, ctx, 5); g != 0 {
		t.Errorf("punishment: 30 minutes later %d granted, want none (trapped)", g)
	}

	loadPattern(t, ctx, "batch")
	if g := grantsJS(t, ctx, 60); g != 50 {
		t.Errorf("batch: %d granted in the minute, want 50", g)
	}
	for _, ms := range []string{"61000", "30 * 60000", "28 * 60000"} {
		js[any](t, ctx, `charonSim.advance(`+ms+`)`)
		if g := grantsJS(t, ctx, 1); g != 0 {
			t.Errorf("batch: after +%s ms a request was granted, want nothing for the rest of the hour", ms)
		}
	}
	do(t, ctx, `charonSim.advance(60000)`)
	if g := grantsJS(t, ctx, 1); g != 1 {
		t.Errorf("batch: the next hour's request was rejected")
	}

	// Invalid settings: config check's message, in the page too.
	r := js[map[string]any](t, ctx, `charonSim.load("key: user\ntiers:\n  - {limit: 5, window: -1s}\n")`)
	msg, _ := r["error"].(string)
	shown, _ := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#error0")))
	if !strings.Contains(msg, "sim.yaml:3: tiers[0].window:") || shown != msg {
		t.Errorf("invalid window: %q shown %q, want config check's sim.yaml:3 message", msg, shown)
	}
}

// TestBrowserKeyboardAndDrawing: the spacebar sends a request; after grants
// and rejections the lane's canvas holds white dots and red crosses; the
// second lane sees the same requests.
func TestBrowserKeyboardAndDrawing(t *testing.T) {
	ctx, _ := page(t)
	do(t, ctx, `charonSim.setSpeed(0)`)
	loadPattern(t, ctx, "simple")
	do(t, ctx, `charonSim.compare(true)`)
	if r := js[map[string]any](t, ctx, `charonSim.load("key: user\ntiers:\n  - {limit: 2, window: 1s}\n", 1)`); r["ok"] != true {
		t.Fatalf("lane B: %v", r)
	}
	for range 8 {
		if err := chromedp.Do(ctx, chromedp.KeyEvent(" ")); err != nil {
			t.Fatal(err)
		}
		do(t, ctx, `charonSim.advance(100)`)
	}
	if js[int](t, ctx, `JSON.parse(charonSim.state()).tiers[0].hits`) != 5 {
		t.Error("state() read with JSON.parse differs")
	}
	s := js[simState](t, ctx, `charonSim.state()`)
	if s.Last == nil || s.Last.OK || s.Tiers[0].Hits != 5 || s.Compare == nil || s.Compare.Tiers[0].Hits != 2 {
		t.Fatalf("after 8 spacebar presses: %+v (compare %+v), want lane A 5 hits and a rejection, lane B 2", s, s.Compare)
	}
	shot, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS("#lane0 canvas")))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatal(err)
	}
	white, red := count(img)
	if white < 20 || red < 10 {
		t.Errorf("the canvas has %d white and %d red pixels: want dots and crosses drawn", white, red)
	}
}

func count(img image.Image) (white, red int) {
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			r, g, bl = r>>8, g>>8, bl>>8
			switch {
			case r > 240 && g > 240 && bl > 240:
				white++
			case r > 200 && g < 90 && bl < 90:
				red++
			}
		}
	}
	return white, red
}

// TestBrowserSpaceAfterClickAndLabels: Space sends a request wherever the
// focus is but a text field, a pattern button or Send just clicked
// included (neither missing it nor clicking the button again, which would
// reload the pattern); the status line says "no tier active", never "tier
// 0", apart from the engine's summary; the axis runs from the past to +500ms
// at its right edge.
func TestBrowserSpaceAfterClickAndLabels(t *testing.T) {
	ctx, _ := page(t)
	do(t, ctx, `charonSim.setSpeed(0)`)
	space := func(n int) {
		t.Helper()
		for range n {
			if err := chromedp.Do(ctx, chromedp.KeyEvent(" ")); err != nil {
				t.Fatal(err)
			}
		}
	}
	hits := func() int64 { return js[simState](t, ctx, `charonSim.state()`).Tiers[0].Hits }
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		return s
	}

	// The first pattern, simple (5 per second), clicked: a fresh lane.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#patterns button:first-child"))); err != nil {
		t.Fatal(err)
	}
	do(t, ctx, `charonSim.advance(0)`)
	status, summary := text("#lane0 .stats .status"), text("#lane0 .stats .summary")
	if strings.Contains(status, "tier 0") || !strings.HasPrefix(status, "no tier active · remaining 5") ||
		!strings.HasPrefix(summary, "no tier active (the next request enters tier 1)") || strings.Contains(status, summary) {
		t.Errorf("fresh lane: status %q, summary %q; want no tier active and the summary apart", status, summary)
	}
	if axis := js[[]string](t, ctx, `charonSim.state().axis`); len(axis) != 5 || axis[0] != "-9.5s" || axis[3] != "-2s" || axis[4] != "+500ms" {
		t.Errorf("axis %q, want -9.5s … -2s, +500ms", axis)
	}

	// Space with the pattern button focused: three requests, no reload.
	if f := js[string](t, ctx, `document.activeElement.textContent`); f != "simple" {
		t.Fatalf("focus on %q, want the pattern button simple", f)
	}
	space(3)
	do(t, ctx, `charonSim.advance(0)`)
	if h := hits(); h != 3 {
		t.Errorf("3 presses of Space on the pattern button: %d hits, want 3 (none missed, no reload)", h)
	}
	if st := text("#lane0 .stats .status"); !strings.HasPrefix(st, "tier 1 · remaining 2") {
		t.Errorf("status %q, want tier 1 · remaining 2", st)
	}

	// Send clicked (one request), then Space on it: one more.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#send"))); err != nil {
		t.Fatal(err)
	}
	space(1)
	do(t, ctx, `charonSim.advance(0)`)
	if h := hits(); h != 5 {
		t.Errorf("Send clicked, then Space: %d hits, want 5", h)
	}

	// In a text field, Space is the field's.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#yaml0"))); err != nil {
		t.Fatal(err)
	}
	space(1)
	if h := hits(); h != 5 {
		t.Errorf("Space in the YAML box sent a request: %d hits, want 5", h)
	}
}
