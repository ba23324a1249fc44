package main

import (
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"
)

// TestSpecFilesParse: every example spec parses, and the YAML form of a
// request is the same message as its JSON form.
func TestSpecFilesParse(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.*")
	if err != nil {
		t.Fatal(err)
	}
	parsed := 0
	for _, f := range files {
		if ext := filepath.Ext(f); ext != ".json" && ext != ".yaml" && ext != ".yml" {
			continue
		}
		req, err := readSpec(f)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if len(req.GetSpec().GetTasks()) == 0 || req.GetSpec().GetIdempotencyKey() == "" {
			t.Errorf("%s: parsed to %v", f, req)
		}
		parsed++
	}
	if parsed < 2 {
		t.Fatalf("parsed %d example specs, want the JSON and the YAML one at least", parsed)
	}

	dir := t.TempDir()
	jsonPath, yamlPath := filepath.Join(dir, "s.json"), filepath.Join(dir, "s.yaml")
	writeFile(t, jsonPath, `{"spec": {"idempotencyKey": "k", "tasks": [{"id": "a", "tokenBudget": 5, "dependsOn": []}],
		"budget": {"limitTokens": 9}, "onExhaustion": "EXHAUSTION_POLICY_DRAIN", "limits": {"runTimeout": "90s"}}}`)
	writeFile(t, yamlPath, "spec:\n  idempotencyKey: k\n  tasks:\n    - {id: a, tokenBudget: 5}\n  budget: {limitTokens: 9}\n"+
		"  onExhaustion: EXHAUSTION_POLICY_DRAIN\n  limits: {runTimeout: 90s}\n")
	fromJSON, err := readSpec(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	fromYAML, err := readSpec(yamlPath)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(fromJSON, fromYAML) {
		t.Errorf("YAML spec = %v\nJSON spec = %v", fromYAML, fromJSON)
	}
	writeFile(t, yamlPath, "spec: [unclosed")
	if _, err := readSpec(yamlPath); err == nil {
		t.Error("a malformed YAML spec parsed")
	}
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}
