// Package redact is fanout's one rule for secrets in what anyone but the
// model reads of a tool call: the approval preview, a task's summary (tried,
// failed, error, facts), the write log's errors and the logs. A value under
// a secret-looking name is never shown, nor a string that looks like a
// credential whatever its name; everything else is shown as it was.
//
// The rule is by pattern, so it redacts secrets nobody told it about and
// can miss one that looks like nothing (a bare password in prose). The
// exact redactors beside it (a provider's key in package llm, an MCP
// server's token in package mcp) remove known values and stay in force.
package redact

import (
	"encoding/json"
	"regexp"
	"strings"
)

// Mark is what a redacted value reads as.
const Mark = "[redacted]"

var (
	// secretName matches names whose values are never shown: JSON keys, and
	// in text the name before a ':' or '='.
	secretName = regexp.MustCompile(`(?i)(token|secret|pass|pwd|api[_-]?key|apikey|auth|credential|private[_-]?key|` +
		`cookie|session|bearer|jwt|signature|(^|[_-])key$)`)
	// credential matches what looks like a credential whatever its name: a
	// bearer token, basic credentials where a header value starts, a URL's
	// password, a well-known key prefix, a JWT. Group 1 is kept (what
	// precedes "basic"); the rest of the match is the secret.
	credential = regexp.MustCompile(`(?i)\bbearer\s+[^\s"',;]+|(^\s*|["':=]\s*)basic\s+[^\s"',;]+|` +
		`://[^/@\s"']*:[^/@\s"']*@|\b(sk|pk|rk)[-_]([a-z0-9]+[-_]){0,3}[a-z0-9]{8,}[a-z0-9_-]*|` +
		`\bgh[pousr]_[a-z0-9]{20,}|\bAKIA[0-9A-Z]{16}\b|\bxox[abpr]-[a-z0-9-]*|\beyJ[a-z0-9_-]{10,}\.[a-z0-9_.-]*`)
	// pair matches a name and what separates it from its value in text
	// (`password=`, `"api_key": "`, `Authorization: `, and the same inside a
	// JSON string, quotes escaped). Group 1 is the name. The value is found
	// by valueAt, not by the pattern: each byte is read a bounded number of
	// times, whatever a tool sends.
	pair = regexp.MustCompile(`(?i)([a-z0-9_.-]+)\\?["']?[ \t]*[:=][ \t]*`)
	// headerName is a credential header's name: its bare value is the
	// rest of the line.
	headerName = regexp.MustCompile(`(?i)^(proxy-)?authorization$|^(set-)?cookie$`)
	// scheme is a bare value's leading word that is not the secret.
	scheme = regexp.MustCompile(`(?i)^(bearer|basic|token)[ \t]+`)
)

// Name reports whether a value named n is never shown.
func Name(n string) bool { return secretName.MatchString(n) }

// Text is s with every credential-looking string and every value of a
// secret-looking name replaced by Mark. Text(Text(s)) == Text(s). Its time
// is linear in len(s).
func Text(s string) string {
	s = redactCredentials(s)
	var b strings.Builder
	done := 0 // s[:done] is in b
	for _, m := range pair.FindAllStringSubmatchIndex(s, -1) {
		if m[0] < done || !Name(s[m[2]:m[3]]) {
			continue // inside a value already redacted, or not a secret's name
		}
		vs, ve := valueAt(s, m[1])
		if headerName.MatchString(s[m[2]:m[3]]) && vs == m[1] {
			// A credential header's bare value is the whole rest of its
			// line, whatever its scheme ("Bot …", "ApiKey …", "SSWS …").
			ve = vs
			for ve < len(s) && !strings.ContainsRune("\r\n\"'\\", rune(s[ve])) {
				ve++
			}
		}
		if vs == ve || strings.HasPrefix(s[vs:], Mark) {
			continue
		}
		b.WriteString(s[done:vs])
		b.WriteString(Mark)
		done = ve
	}
	if done == 0 {
		return s
	}
	b.WriteString(s[done:])
	return b.String()
}

// valueAt is where the value starting at s[i:] begins and ends: a quoted
// one's text (its quote escaped or not) up to its closing quote, a line's
// end or the string's, or a bare one (after a scheme word such as
// "Bearer ") up to a space, quote or delimiter.
func valueAt(s string, i int) (start, end int) {
	if strings.HasPrefix(s[i:], `\`) && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\'') {
		i++ // a quote escaped inside a JSON string
	}
	if i < len(s) && (s[i] == '"' || s[i] == '\'') {
		q := s[i]
		start = i + 1
		for end = start; end < len(s) && s[end] != q && s[end] != '\n'; end++ {
			if s[end] == '\\' {
				if end+1 < len(s) && (s[end+1] == q || s[end+1] == '\n') {
					break // the closing quote, escaped
				}
				end++
			}
		}
		return start, min(end, len(s))
	}
	if m := scheme.FindStringIndex(s[i:]); m != nil {
		i += m[1]
	}
	end = i
	for end < len(s) && !strings.ContainsRune(" \t\r\n\"',;&}]\\", rune(s[end])) {
		end++
	}
	return i, end
}

func redactCredentials(s string) string {
	return credential.ReplaceAllStringFunc(s, func(m string) string {
		switch sub := credential.FindStringSubmatch(m); {
		case strings.HasPrefix(m, "://"):
			return "://" + Mark + "@" // a URL's user and password
		case sub[1] != "":
			return sub[1] + Mark // what precedes "basic"
		}
		return Mark
	})
}

// JSON redacts decoded JSON v (from encoding/json, with or without
// UseNumber) in place and returns it: the value of every secret-looking
// key is Mark, and every other string is Text.
func JSON(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if Name(k) {
				x[k] = Mark
			} else {
				x[k] = JSON(e)
			}
		}
	case []any:
		for i, e := range x {
			x[i] = JSON(e)
		}
	case string:
		return Text(x)
	}
	return v
}

// RawJSON is raw redacted as JSON (compact, keys sorted) if it is one JSON
// value, else as Text.
func RawJSON(raw []byte) string {
	var v any
	d := json.NewDecoder(strings.NewReader(string(raw)))
	d.UseNumber()
	if d.Decode(&v) != nil || d.More() {
		return Text(string(raw))
	}
	b, err := json.Marshal(JSON(v))
	if err != nil {
		return Text(string(raw))
	}
	return string(b)
}
