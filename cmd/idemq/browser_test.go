package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
)

// EnvChromium names the Chromium (or Chrome) binary the browser tests
// drive; without it they look for chromium, chromium-browser,
// google-chrome and google-chrome-stable on PATH. services.sh browser
// (make services) installs Debian's chromium.
const EnvChromium = "IDEMQ_CHROMIUM"

// EnvScreenshots is the directory where the browser tests write their
// screenshots of the console's pages (make screenshots: docs/console);
// unset, they write none.
const EnvScreenshots = "IDEMQ_SCREENSHOTS"

// browserTimeout bounds a browser test's whole conversation with Chromium.
const browserTimeout = 5 * time.Minute

// chromiumPath returns the browser to drive. A browser test skips under
// -short, and when no browser is found, unless CI is set (CI=true) or
// screenshots are asked for (EnvScreenshots): then a missing browser
// fails the test, since CI and make screenshots install one.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("a browser test: needs Chromium and the services")
	}
	if p := os.Getenv(EnvChromium); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s=%s: %v", EnvChromium, p, err)
		}
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci || os.Getenv(EnvScreenshots) != "" {
		t.Fatalf("CI or %s is set and no Chromium was found (%s, or chromium on PATH): make services installs it (testdata/services/services.sh browser)", EnvScreenshots, EnvChromium)
	}
	t.Skipf("no Chromium found (%s, or chromium on PATH); testdata/services/services.sh browser installs it", EnvChromium)
	return ""
}

// browserOptions are newBrowser's choices.
type browserOptions struct {
	// noScript disables JavaScript in the tab.
	noScript bool
}

// newBrowser starts a headless Chromium with a profile of its own and
// returns the context of its tab, which the test's end closes (and the
// browser with it).
func newBrowser(t *testing.T, o browserOptions) context.Context {
	t.Helper()
	path := chromiumPath(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		// Chromium's sandbox needs user namespaces that containers and
		// root (CI) rarely have; the pages are the test's own.
		chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()),
	)
	ctx, cancel := context.WithTimeout(context.Background(), browserTimeout)
	t.Cleanup(cancel)
	ctx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancelTab := chromedp.NewContext(ctx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(cancelTab)
	start := []chromedp.Action[chromedp.Void]{chromedp.EmulateViewport(1280, 900)}
	if o.noScript {
		start = append(start, func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			_, err := cdp.Call(ctx, tg, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
			return chromedp.Void{}, err
		})
	}
	if err := chromedp.Do(ctx, start...); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	return ctx
}

// screenshot writes a PNG of the tab's whole page to name.png in the
// EnvScreenshots directory, when that is set, and checks that it stays
// well under 1 MB.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv(EnvScreenshots)
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if len(png) > maxShot {
		t.Errorf("screenshot %s is %d bytes, want at most %d", name, len(png), maxShot)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s.png: %d bytes", name, len(png))
}

// maxShot is the most bytes a screenshot may take.
const maxShot = 400 << 10
