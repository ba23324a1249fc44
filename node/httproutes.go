package node

import (
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// httpRoutes names the RPC an HTTP request calls before its body is read,
// so that its scope is checked first: a Connect or gRPC-Web request by its
// path, a REST request by the google.api.http rules of the services'
// methods (the rules vanguard serves them by).
type httpRoutes struct {
	methods map[string]bool // full method names
	rest    []restRoute
}

type restRoute struct {
	verb   string
	path   *regexp.Regexp
	method string
}

// newHTTPRoutes is the routes of the services sds.
func newHTTPRoutes(sds ...protoreflect.ServiceDescriptor) *httpRoutes {
	rt := &httpRoutes{methods: map[string]bool{}}
	for _, sd := range sds {
		ms := sd.Methods()
		for i := range ms.Len() {
			m := ms.Get(i)
			full := "/" + string(sd.FullName()) + "/" + string(m.Name())
			rt.methods[full] = true
			rule, _ := proto.GetExtension(m.Options(), annotations.E_Http).(*annotations.HttpRule)
			for _, r := range append([]*annotations.HttpRule{rule}, rule.GetAdditionalBindings()...) {
				if verb, tmpl := ruleTemplate(r); tmpl != "" {
					rt.rest = append(rt.rest, restRoute{verb: verb, path: templateRegexp(tmpl), method: full})
				}
			}
		}
	}
	return rt
}

func ruleTemplate(r *annotations.HttpRule) (verb, tmpl string) {
	switch p := r.GetPattern().(type) {
	case *annotations.HttpRule_Get:
		return http.MethodGet, p.Get
	case *annotations.HttpRule_Post:
		return http.MethodPost, p.Post
	case *annotations.HttpRule_Put:
		return http.MethodPut, p.Put
	case *annotations.HttpRule_Patch:
		return http.MethodPatch, p.Patch
	case *annotations.HttpRule_Delete:
		return http.MethodDelete, p.Delete
	case *annotations.HttpRule_Custom:
		return p.Custom.GetKind(), p.Custom.GetPath()
	}
	return "", ""
}

var templateVar = regexp.MustCompile(`\{[^}]*\}`)

// templateRegexp matches the paths of a path template: a variable is one
// segment ("{run_id}") or, with "**", the rest.
func templateRegexp(tmpl string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^")
	last := 0
	for _, loc := range templateVar.FindAllStringIndex(tmpl, -1) {
		b.WriteString(regexp.QuoteMeta(tmpl[last:loc[0]]))
		if strings.Contains(tmpl[loc[0]:loc[1]], "**") {
			b.WriteString(".+")
		} else {
			b.WriteString("[^/:]+")
		}
		last = loc[1]
	}
	b.WriteString(regexp.QuoteMeta(tmpl[last:]))
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

// method is the full name of the RPC r calls, "" if none.
func (rt *httpRoutes) method(r *http.Request) string {
	if rt.methods[r.URL.Path] {
		return r.URL.Path
	}
	for _, route := range rt.rest {
		if route.verb == r.Method && route.path.MatchString(r.URL.Path) {
			return route.method
		}
	}
	return ""
}

// compressed reports whether r's body, its messages or a Connect GET's
// message are compressed: a compressed request is charged at the body
// limit, what it may inflate to.
func compressed(r *http.Request) bool {
	for _, h := range []string{"Content-Encoding", "Connect-Content-Encoding", "Grpc-Encoding"} {
		if v := r.Header.Get(h); v != "" && v != "identity" {
			return true
		}
	}
	// A Connect GET names its message's compression in its query.
	v := r.URL.Query().Get("compression")
	return v != "" && v != "identity"
}

// boundedGzip is vanguard's gzip decompressor, stopping at limit inflated
// bytes: past it, the request is refused RESOURCE_EXHAUSTED naming the
// limit, and no more than limit+1 bytes were inflated.
func boundedGzip(limit int64) func() connect.Decompressor {
	return func() connect.Decompressor { return &limitedGzip{limit: limit} }
}

type limitedGzip struct {
	gz    gzip.Reader
	limit int64
	n     int64
}

func (l *limitedGzip) Reset(r io.Reader) error {
	l.n = 0
	return l.gz.Reset(r)
}

func (l *limitedGzip) Read(p []byte) (int, error) {
	if int64(len(p)) > l.limit+1-l.n {
		p = p[:l.limit+1-l.n]
	}
	n, err := l.gz.Read(p)
	l.n += int64(n)
	if l.n > l.limit {
		return n, connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("request inflates past %d bytes; this listener reads at most that (twice the receive limit)", l.limit))
	}
	return n, err
}

func (l *limitedGzip) Close() error { return l.gz.Close() }
