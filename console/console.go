// Package console serves fanout's web console: the built frontend in
// console/dist (index.html, app.js, app.css), embedded in the binary, so
// serving it needs no Node and no files on disk.
//
// The frontend's sources are in console/web (TypeScript, with the API
// client generated from proto/fanout/v1); make console rebuilds dist, and
// make verify fails when the committed dist is not what the sources build.
// The console talks to the orchestrator's HTTP listener at its own origin
// (Connect, JSON), so it is served on that listener, under /console/.
package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"
)

// Prefix is the path the console is served under.
const Prefix = "/console/"

//go:embed dist
var dist embed.FS

// asset is one embedded file, read once.
type asset struct {
	body        []byte
	contentType string
	etag        string
}

// contentTypes maps the extensions dist holds to their types: set here,
// not from the system's MIME table, which varies by machine.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
	".png":  "image/png",
	".ico":  "image/x-icon",
	".json": "application/json",
	".txt":  "text/plain; charset=utf-8",
}

var loadAssets = sync.OnceValue(func() map[string]asset {
	assets := map[string]asset{}
	err := fs.WalkDir(dist, "dist", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := dist.ReadFile(p)
		if err != nil {
			return err
		}
		ct, ok := contentTypes[path.Ext(p)]
		if !ok {
			ct = "application/octet-stream"
		}
		sum := sha256.Sum256(body)
		assets[strings.TrimPrefix(p, "dist/")] = asset{body: body, contentType: ct, etag: `"` + hex.EncodeToString(sum[:16]) + `"`}
		return nil
	})
	if err != nil {
		// The files are compiled in: a failure to read them is a bug.
		panic("console: reading the embedded assets: " + err.Error())
	}
	return assets
})

// Handler returns the handler that serves the console. It expects the
// request's full path, /console/ prefix included: mount it as
//
//	mux.Handle("/console/", console.Handler())
//
// (not under http.StripPrefix). It serves index.html at /console/ and
// /console/index.html, every other built file by its name
// (/console/app.js), answers /console with a redirect to /console/, and
// 404 to any other path; only GET and HEAD, 405 otherwise. Every response
// carries Cache-Control: no-cache and an ETag of the content (If-None-Match
// gets a 304), so a new binary's assets are never served stale. Security
// headers (the Content-Security-Policy the assets are written for:
// default-src 'none', script-src, style-src, connect-src 'self', ...) are
// the caller's to set.
func Handler() http.Handler {
	assets := loadAssets()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path == strings.TrimSuffix(Prefix, "/") {
			http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
			return
		}
		name, ok := strings.CutPrefix(r.URL.Path, Prefix)
		if !ok {
			http.NotFound(w, r)
			return
		}
		if name == "" {
			name = "index.html"
		}
		a, ok := assets[name]
		if !ok {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Type", a.contentType)
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", a.etag)
		h.Set("X-Content-Type-Options", "nosniff")
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(a.body))
	})
}
