package console_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/fanout/fanout/console"
)

// The console is mounted at its prefix, beside the API on the same
// listener; the handler expects the full path.
func ExampleHandler() {
	mux := http.NewServeMux()
	mux.Handle(console.Prefix, console.Handler())

	for _, p := range []string{"/console/", "/console/app.js", "/console/missing.js"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
		fmt.Println(p, rec.Code, rec.Header().Get("Content-Type"))
	}
	// Output:
	// /console/ 200 text/html; charset=utf-8
	// /console/app.js 200 text/javascript; charset=utf-8
	// /console/missing.js 404 text/plain; charset=utf-8
}
