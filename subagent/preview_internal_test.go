package subagent

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fanout/fanout/runs"
)

// TestPreviewRedactsSecrets: what an approver sees of a call's arguments
// holds no value whose name looks secret, nor a string that looks like a
// credential whatever its name, and is at most runs.MaxPreviewBytes.
func TestPreviewRedactsSecrets(t *testing.T) {
	t.Parallel()
	args := map[string]any{
		"amount": 12, "to": "acct-9", "author": map[string]any{"api_key": "k1"},
		"passphrase": "p1", "pwd": "p2", "access_key": "p3", "Authorization": "p4",
		"header": "Bearer p5", "dsn": "postgres://u:p6@db/x", "note": "use sk-live-abcdefgh12345 here",
		"gh": "ghp_abcdefghijklmnopqrstuvwx", "aws": "AKIAABCDEFGHIJKLMNOP", "list": []any{"Basic p7"},
	}
	b, _ := json.Marshal(args)
	got := preview(b)
	for _, secret := range []string{"k1", "p1", "p2", "p3", "p4", "p5", "p6", "sk-live", "ghp_", "AKIA", "p7"} {
		if strings.Contains(got, secret) {
			t.Errorf("preview %s shows %q", got, secret)
		}
	}
	for _, kept := range []string{`"amount":12`, `"to":"acct-9"`} {
		if !strings.Contains(got, kept) {
			t.Errorf("preview %s lost %s", got, kept)
		}
	}
	long, _ := json.Marshal(map[string]string{"text": strings.Repeat("é", 2000)})
	if p := preview(long); len(p) > runs.MaxPreviewBytes || !strings.HasSuffix(p, " …[cut]") || !utf8.ValidString(p) {
		t.Errorf("a long preview is %d bytes (%q…); want at most %d, marked cut", len(p), p[:20], runs.MaxPreviewBytes)
	}
	if p := preview(json.RawMessage("not json")); strings.Contains(p, "not json") {
		t.Errorf("arguments that are not JSON are shown: %q", p)
	}
}
