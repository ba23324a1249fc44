package main

import (
	"net/http"
)

// consoleHandler is the web console's handler (console.Handler).
func consoleHandler() http.Handler { return http.NotFoundHandler() }

// httpURL is the base URL of an HTTP listener on addr.
func httpURL(addr string, tls bool) string {
	if tls {
		return "https://" + addr
	}
	return "http://" + addr
}
