package main

import (
	"net/http"

	"github.com/fanout/fanout/console"
)

// consoleHandler is the web console's handler, mounted at /console/ on the
// HTTP listener.
func consoleHandler() http.Handler { return console.Handler() }

// httpURL is the base URL of an HTTP listener on addr.
func httpURL(addr string, tls bool) string {
	if tls {
		return "https://" + addr
	}
	return "http://" + addr
}
