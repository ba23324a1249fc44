package runs

import (
	"os"
	"regexp"
	"slices"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// TestStoredTextsMatchTheSchema: every run state and task status but the
// zero value has a stored text, and the texts are exactly those the
// columns' CHECK constraints allow (migrations/schema.sql, which the store
// tests keep equal to what the migrations build). A value added to the API
// fails here until it has a text and the constraint takes it.
func TestStoredTextsMatchTheSchema(t *testing.T) {
	schema, err := os.ReadFile("../migrations/schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	checkTexts(t, schema, "run_state_check", fanoutv1.RunState(0).Descriptor(), stateTexts)
	checkTexts(t, schema, "task_status_check", fanoutv1.TaskStatus(0).Descriptor(), statusTexts)
}

func checkTexts[E ~int32](t *testing.T, schema []byte, constraint string, d protoreflect.EnumDescriptor, texts map[E]string) {
	t.Helper()
	for i := range d.Values().Len() {
		v := d.Values().Get(i)
		_, ok := texts[E(v.Number())]
		switch {
		case v.Number() == 0 && ok:
			t.Errorf("%s has a stored text; the zero value is never stored", v.Name())
		case v.Number() != 0 && !ok:
			t.Errorf("%s has no stored text", v.Name())
		}
	}
	for e := range texts {
		if d.Values().ByNumber(protoreflect.EnumNumber(e)) == nil {
			t.Errorf("the stored texts name %d, not a %s", e, d.Name())
		}
	}
	m := regexp.MustCompile(`CONSTRAINT ` + constraint + ` CHECK \(\w+ = ANY \(ARRAY\[([^\]]*)\]\)\)`).FindSubmatch(schema)
	if m == nil {
		t.Fatalf("no %s of the form CHECK (column = ANY (ARRAY[...])) in schema.sql", constraint)
	}
	var allowed []string
	for _, q := range regexp.MustCompile(`'([^']*)'::text`).FindAllSubmatch(m[1], -1) {
		allowed = append(allowed, string(q[1]))
	}
	var stored []string
	for _, text := range texts {
		stored = append(stored, text)
		if !slices.Contains(allowed, text) {
			t.Errorf("%s does not allow the stored text %q", constraint, text)
		}
	}
	for _, a := range allowed {
		if !slices.Contains(stored, a) {
			t.Errorf("%s allows %q, which no %s is stored as", constraint, a, d.Name())
		}
	}
}

// TestTextForDisplay: values with no stored text still show, for logs and
// metric attributes, as they did: by name without the prefix, or number.
func TestTextForDisplay(t *testing.T) {
	for _, c := range []struct {
		e    protoreflect.Enum
		want string
	}{
		{fanoutv1.JoinPolicy_JOIN_POLICY_FAIL_FAST, "FAIL_FAST"},
		{fanoutv1.RunState_RUN_STATE_UNSPECIFIED, "UNSPECIFIED"},
		{fanoutv1.TaskStatus(99), "99"},
		{fanoutv1.TaskStatus_TASK_STATUS_ITERATION_LIMIT, "ITERATION_LIMIT"},
	} {
		if got := Text(c.e); got != c.want {
			t.Errorf("Text(%v) = %q, want %q", c.e, got, c.want)
		}
	}
}
