package console_test

import (
	"encoding/xml"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/fanout/fanout/console"
)

// reply is what the handler answered.
type reply struct {
	status int
	header http.Header
	body   string
}

func get(t *testing.T, h http.Handler, method, target string, header http.Header) reply {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return reply{status: rec.Code, header: rec.Header(), body: rec.Body.String()}
}

func TestHandlerServesTheAssets(t *testing.T) {
	t.Parallel()
	h := console.Handler()
	for _, tc := range []struct {
		path, contentType, contains string
	}{
		{"/console/", "text/html; charset=utf-8", "<html lang=\"en\">"},
		{"/console/index.html", "text/html; charset=utf-8", "<title>"},
		{"/console/app.js", "text/javascript; charset=utf-8", "fanout.console.apiKey"},
		{"/console/app.css", "text/css; charset=utf-8", ":focus-visible"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			t.Parallel()
			resp := get(t, h, http.MethodGet, tc.path, nil)
			if resp.status != http.StatusOK {
				t.Fatalf("GET %s: status %d, want 200", tc.path, resp.status)
			}
			if got := resp.header.Get("Content-Type"); got != tc.contentType {
				t.Errorf("GET %s: Content-Type %q, want %q", tc.path, got, tc.contentType)
			}
			if got := resp.header.Get("Cache-Control"); got != "no-cache" {
				t.Errorf("GET %s: Cache-Control %q, want no-cache", tc.path, got)
			}
			if !strings.Contains(resp.body, tc.contains) {
				t.Errorf("GET %s: body does not contain %q", tc.path, tc.contains)
			}
			etag := resp.header.Get("ETag")
			if etag == "" {
				t.Fatalf("GET %s: no ETag", tc.path)
			}
			again := get(t, h, http.MethodGet, tc.path, http.Header{"If-None-Match": {etag}})
			if again.status != http.StatusNotModified {
				t.Errorf("GET %s with If-None-Match: status %d, want 304", tc.path, again.status)
			}
		})
	}
}

func TestHandlerRefusesOtherPaths(t *testing.T) {
	t.Parallel()
	h := console.Handler()
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{http.MethodGet, "/console/nope.js", http.StatusNotFound},
		{http.MethodGet, "/console/dist/app.js", http.StatusNotFound},
		{http.MethodGet, "/console/../go.mod", http.StatusNotFound},
		{http.MethodGet, "/console/%2e%2e/console.go", http.StatusNotFound},
		{http.MethodGet, "/console/index.html/", http.StatusNotFound},
		{http.MethodGet, "/app.js", http.StatusNotFound},
		{http.MethodGet, "/", http.StatusNotFound},
		{http.MethodGet, "/console", http.StatusMovedPermanently},
		{http.MethodPost, "/console/", http.StatusMethodNotAllowed},
		{http.MethodHead, "/console/app.js", http.StatusOK},
	} {
		resp := get(t, h, tc.method, tc.path, nil)
		if resp.status != tc.status {
			t.Errorf("%s %s: status %d, want %d", tc.method, tc.path, resp.status, tc.status)
		}
	}
	if loc := get(t, h, http.MethodGet, "/console", nil).header.Get("Location"); loc != "/console/" {
		t.Errorf("GET /console redirects to %q, want /console/", loc)
	}
}

// TestIndexWorksUnderTheCSP parses index.html as the browser would and
// checks what the Content-Security-Policy (script-src 'self'; style-src
// 'self'; no inline code) needs: every script and stylesheet is an
// external file of this origin that the handler serves, and there is no
// inline script, no <style>, no style attribute and no inline handler.
func TestIndexWorksUnderTheCSP(t *testing.T) {
	t.Parallel()
	h := console.Handler()
	page := get(t, h, http.MethodGet, "/console/", nil).body

	d := xml.NewDecoder(strings.NewReader(page))
	d.Strict = false
	d.AutoClose = xml.HTMLAutoClose
	d.Entity = xml.HTMLEntity
	var refs []string
	var inScript bool
	var scripts, stylesheets int
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("parsing index.html: %v", err)
		}
		switch tk := tok.(type) {
		case xml.StartElement:
			attrs := map[string]string{}
			for _, a := range tk.Attr {
				name := strings.ToLower(a.Name.Local)
				attrs[name] = a.Value
				if name == "style" || strings.HasPrefix(name, "on") {
					t.Errorf("<%s> has an inline %s attribute", tk.Name.Local, name)
				}
			}
			switch strings.ToLower(tk.Name.Local) {
			case "script":
				scripts++
				inScript = true
				if attrs["src"] == "" {
					t.Errorf("inline <script> (no src)")
				}
				refs = append(refs, attrs["src"])
			case "style":
				t.Errorf("inline <style>")
			case "link":
				if attrs["rel"] == "stylesheet" {
					stylesheets++
				}
				if attrs["rel"] != "icon" { // the icon is data:, which img-src allows
					refs = append(refs, attrs["href"])
				}
			case "img", "iframe", "object", "embed", "base", "form":
				t.Errorf("index.html has a <%s>: the page's markup is built by app.js", tk.Name.Local)
			}
		case xml.CharData:
			if inScript && strings.TrimSpace(string(tk)) != "" {
				t.Errorf("inline script text: %q", strings.TrimSpace(string(tk)))
			}
		case xml.EndElement:
			if strings.EqualFold(tk.Name.Local, "script") {
				inScript = false
			}
		}
	}
	if scripts != 1 || stylesheets != 1 {
		t.Errorf("index.html has %d scripts and %d stylesheets, want app.js and app.css", scripts, stylesheets)
	}
	for _, ref := range refs {
		u, err := url.Parse(ref)
		if err != nil || u.Scheme != "" || u.Host != "" || strings.HasPrefix(ref, "//") {
			t.Errorf("index.html references %q: not a same-origin path", ref)
			continue
		}
		target := (&url.URL{Path: console.Prefix}).ResolveReference(u).Path
		if resp := get(t, h, http.MethodGet, target, nil); resp.status != http.StatusOK {
			t.Errorf("index.html references %q (%s): status %d", ref, target, resp.status)
		}
	}
}

// TestAssetsNeedNoUnsafeEval checks the bundle builds no code from strings,
// which script-src 'self' (no 'unsafe-eval') refuses, and that the
// stylesheet loads nothing from another origin.
func TestAssetsNeedNoUnsafeEval(t *testing.T) {
	t.Parallel()
	h := console.Handler()
	js := get(t, h, http.MethodGet, "/console/app.js", nil).body
	for _, bad := range []string{"eval(", "new Function(", "Function(\"", "setAttribute(\"style\"", "innerHTML="} {
		if strings.Contains(js, bad) {
			t.Errorf("app.js contains %q", bad)
		}
	}
	css := get(t, h, http.MethodGet, "/console/app.css", nil).body
	for _, bad := range []string{"@import", "url(http", "url(//"} {
		if strings.Contains(css, bad) {
			t.Errorf("app.css contains %q", bad)
		}
	}
}
