package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fanout/fanout/store/storetest"
)

// TestSecretsFromFiles: every secret a node takes from its operator can be
// a file (a mounted Secret) instead of a flag or an environment variable:
// --database-url-file and --admin-database-url-file (also as
// FANOUT_DATABASE_URL_FILE, FANOUT_ADMIN_DATABASE_URL_FILE), and the
// providers' OPENAI_API_KEY_FILE and ANTHROPIC_API_KEY_FILE. One trailing
// newline is dropped. Both forms at once, an empty file or a missing one
// is refused with an error that names the flag and the file and never
// what the file holds.
func TestSecretsFromFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const url, adminURL = "postgres://node:s3cret-node@db:5432/fanout", "postgres://admin:s3cret-admin@db:5432/fanout"
	urlFile, adminFile := write("url", url+"\n"), write("admin", adminURL)
	empty := write("empty", "\n")
	env := func(vars map[string]string) (*Env, *bytes.Buffer) {
		var stderr bytes.Buffer
		return &Env{Stdout: &stderr, Stderr: &stderr, Getenv: func(k string) string { return vars[k] }}, &stderr
	}

	t.Run("orchestrator flags", func(t *testing.T) {
		e, _ := env(nil)
		c, err := parseOrchestrator(e, []string{"--database-url-file", urlFile, "--admin-database-url-file", adminFile})
		if err != nil {
			t.Fatal(err)
		}
		if c.sf.databaseURL != url || c.oc.AdminDatabaseURL != adminURL {
			t.Errorf("database URL %q, admin URL %q: want the files' contents less a trailing newline", c.sf.databaseURL, c.oc.AdminDatabaseURL)
		}
	})
	t.Run("worker environment", func(t *testing.T) {
		e, _ := env(map[string]string{"FANOUT_DATABASE_URL_FILE": urlFile})
		c, err := parseWorker(e, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.sf.databaseURL != url {
			t.Errorf("database URL %q, want the file's", c.sf.databaseURL)
		}
	})
	for _, bad := range []struct {
		name string
		args []string
		vars map[string]string
		want string
	}{
		{"both", []string{"--database-url", url, "--database-url-file", urlFile}, nil, "--database-url and --database-url-file are both set"},
		{"both, one from the environment", []string{"--database-url-file", urlFile}, map[string]string{"DATABASE_URL": url}, "are both set"},
		{"empty", []string{"--database-url-file", empty}, nil, "--database-url-file: " + empty + " is empty"},
		{"missing", []string{"--database-url-file", filepath.Join(dir, "nope")}, nil, "--database-url-file: read " + filepath.Join(dir, "nope")},
		{"admin both", []string{"--admin-database-url", adminURL, "--admin-database-url-file", adminFile}, nil, "--admin-database-url and --admin-database-url-file are both set"},
	} {
		t.Run(bad.name, func(t *testing.T) {
			e, stderr := env(bad.vars)
			if _, err := parseOrchestrator(e, bad.args); err == nil {
				t.Fatalf("parsed; want refused (%s)", bad.want)
			}
			if got := stderr.String(); !strings.Contains(got, bad.want) || strings.Contains(got, "s3cret") {
				t.Errorf("error %q: want one naming %q and holding no secret", got, bad.want)
			}
		})
	}

	t.Run("provider keys", func(t *testing.T) {
		keyFile := write("openai", "sk-s3cret\n")
		e, _ := env(map[string]string{"OPENAI_API_KEY_FILE": keyFile})
		if v, err := secretEnv(e, "OPENAI_API_KEY"); err != nil || v != "sk-s3cret" {
			t.Errorf("OPENAI_API_KEY_FILE: %q, %v; want the file's content less its newline", v, err)
		}
		e, _ = env(map[string]string{"ANTHROPIC_API_KEY": "sk-s3cret"})
		if v, err := secretEnv(e, "ANTHROPIC_API_KEY"); err != nil || v != "sk-s3cret" {
			t.Errorf("ANTHROPIC_API_KEY: %q, %v; want it as it is", v, err)
		}
		for _, vars := range []map[string]string{
			{"OPENAI_API_KEY": "sk-s3cret", "OPENAI_API_KEY_FILE": keyFile},
			{"OPENAI_API_KEY_FILE": empty},
		} {
			e, _ := env(vars)
			if _, err := secretEnv(e, "OPENAI_API_KEY"); err == nil || !strings.Contains(err.Error(), "OPENAI_API_KEY") ||
				strings.Contains(err.Error(), "s3cret") {
				t.Errorf("%v: %v; want refused, naming the variable, without the key", vars, err)
			}
		}
		// Through the providers the worker builds: the key from the file is
		// the one openai gets (a provider without a key is refused).
		pf := parseProviderFlags(t, []string{"--provider", "openai"}, map[string]string{"OPENAI_API_KEY_FILE": keyFile})
		e, _ = env(map[string]string{"OPENAI_API_KEY_FILE": keyFile})
		if _, err := pf.models(e, nil, nil, nil, nil); err != nil {
			t.Errorf("--provider openai with OPENAI_API_KEY_FILE: %v", err)
		}
		e, _ = env(nil)
		if _, err := pf.models(e, nil, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "OPENAI_API_KEY_FILE") {
			t.Errorf("--provider openai with no key: %v; want refused, naming OPENAI_API_KEY_FILE", err)
		}
	})
}

// TestMigrateReadsTheDatabaseURLFromAFile: `fanout migrate
// --database-url-file` (the chart's migrate Job) migrates the database the
// file names; a URL that fails to connect is reported without its password.
func TestMigrateReadsTheDatabaseURLFromAFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	if err := os.WriteFile(good, []byte(storetest.NewDB(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("postgres://fanout:s3cret-pw@127.0.0.1:1/fanout?connect_timeout=2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noEnv := func(string) string { return "" }
	var out bytes.Buffer
	if code := Main(t.Context(), []string{"migrate", "--database-url-file", good}, &out, &out, noEnv); code != 0 {
		t.Fatalf("migrate --database-url-file: exit %d: %s", code, out.String())
	}
	out.Reset()
	if code := Main(t.Context(), []string{"migrate", "--database-url-file", bad}, &out, &out, noEnv); code == 0 {
		t.Fatalf("migrate against a closed port: exit 0: %s", out.String())
	}
	if strings.Contains(out.String(), "s3cret-pw") {
		t.Errorf("a failed migrate printed the password: %s", out.String())
	}
}
