package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// textCase puts bad text into one string field of validSpec.
type textCase struct {
	proto protoreflect.FullName // the string field it exercises
	field func(bad string) string
	set   func(s *fanoutv1.RunSpec, bad string)
}

func fixed(path string) func(string) string { return func(string) string { return path } }

// textCases returns one case per string field a RunSpec can hold.
func textCases() []textCase {
	return []textCase{
		{"fanout.v1.RunSpec.idempotency_key", fixed("spec.idempotency_key"),
			func(s *fanoutv1.RunSpec, bad string) { s.IdempotencyKey = "ke" + bad + "y" }},
		{"fanout.v1.RunSpec.tenant_id", fixed("spec.tenant_id"),
			func(s *fanoutv1.RunSpec, bad string) { s.TenantId = "t" + bad + "1" }},
		{"fanout.v1.RunSpec.goal", fixed("spec.goal"),
			func(s *fanoutv1.RunSpec, bad string) { s.Goal = "find " + bad + "facts" }},
		{"fanout.v1.TaskSpec.id", fixed("spec.tasks[5].id"),
			func(s *fanoutv1.RunSpec, bad string) { s.Tasks[5].Id = "t" + bad + "05" }},
		{"fanout.v1.TaskSpec.instruction", fixed("spec.tasks[3].instruction"),
			func(s *fanoutv1.RunSpec, bad string) { s.Tasks[3].Instruction = "look " + bad + "up" }},
		{"fanout.v1.TaskSpec.allowed_tools", fixed("spec.tasks[4].allowed_tools[1]"),
			func(s *fanoutv1.RunSpec, bad string) { s.Tasks[4].AllowedTools[1] = "fetch" + bad }},
		{"fanout.v1.TaskSpec.depends_on", fixed("spec.tasks[2].depends_on[1]"),
			func(s *fanoutv1.RunSpec, bad string) { s.Tasks[2].DependsOn[1] = "t0" + bad + "1" }},
		{"fanout.v1.RunSpec.LabelsEntry.key", func(bad string) string { return fmt.Sprintf("spec.labels[%q]", "te"+bad+"am") },
			func(s *fanoutv1.RunSpec, bad string) {
				s.Labels = map[string]string{"te" + bad + "am": "search", "ok": "ok"}
			}},
		{"fanout.v1.RunSpec.LabelsEntry.value", fixed(`spec.labels["team"]`),
			func(s *fanoutv1.RunSpec, bad string) {
				s.Labels = map[string]string{"team": "sea" + bad + "rch", "ok": "ok"}
			}},
		{"fanout.v1.ModelSettings.provider", fixed("spec.model.provider"),
			func(s *fanoutv1.RunSpec, bad string) { s.Model.Provider = "si" + bad + "m" }},
		{"fanout.v1.ModelSettings.model", fixed("spec.model.model"),
			func(s *fanoutv1.RunSpec, bad string) { s.Model.Model = "gpt" + bad + "-4o" }},
	}
}

// badText is text PostgreSQL's text type refuses, and what a violation must
// say about it.
var badText = []struct{ text, want string }{
	{"\x00", "must not contain NUL bytes"},
	{"\xff", "must be valid UTF-8"},
	{"\xc3\x28", "must be valid UTF-8"},     // a broken two-byte sequence
	{"\xed\xa0\x80", "must be valid UTF-8"}, // a UTF-16 surrogate
	{"\xc0\x80", "must be valid UTF-8"},     // an overlong NUL
}

// checkTextViolation checks that err is INVALID_ARGUMENT with a field
// violation of field whose description says want.
func checkTextViolation(t *testing.T, name string, err error, field, want string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Errorf("%s: code %s (%q), want InvalidArgument", name, st.Code(), st.Message())
		return
	}
	var got []string
	for _, v := range fieldViolations(st) {
		if v.GetField() == field && strings.Contains(v.GetDescription(), want) {
			return
		}
		got = append(got, v.GetField()+": "+v.GetDescription())
	}
	t.Errorf("%s: no violation of %s saying %q; got %q", name, field, want, got)
}

// TestValidateRejectsNULOverGRPC sends a NUL byte in each string field of a
// spec through StartRun and Run. NUL is valid UTF-8, so protobuf passes it,
// and PostgreSQL's text refuses it: validation must name the field.
func TestValidateRejectsNULOverGRPC(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := b.orchestrator(t, "v1", orchestrator.Config{MaxRunTokens: 1e9})
	for i, tc := range textCases() {
		field := tc.field("\x00")
		// A key of its own per call, so that a spec accepted by mistake
		// does not turn the next calls into idempotent replays.
		s := validSpec()
		s.IdempotencyKey = fmt.Sprintf("start-%d", i)
		tc.set(s, "\x00")
		_, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
		checkTextViolation(t, "StartRun "+field, err, field, "must not contain NUL bytes")

		s = validSpec()
		s.IdempotencyKey = fmt.Sprintf("run-%d", i)
		tc.set(s, "\x00")
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		stream, err := n.client.Run(ctx, &fanoutv1.RunRequest{Spec: s})
		if err == nil {
			_, err = stream.Recv()
		}
		cancel()
		checkTextViolation(t, "Run "+field, err, field, "must not contain NUL bytes")
	}
	b.checkNothingWritten(t, n)
}

// TestValidateRejectsBadText checks validation directly with text gRPC would
// refuse before it (invalid UTF-8) as well as NUL, which it passes.
func TestValidateRejectsBadText(t *testing.T) {
	t.Parallel()
	cfg := orchestrator.Config{KnownTools: []string{"search", "fetch"}}
	if err := cfg.Validate(validSpec()); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	for _, tc := range textCases() {
		for _, bad := range badText {
			field := tc.field(bad.text)
			s := validSpec()
			tc.set(s, bad.text)
			err := cfg.Validate(s)
			var ve budget.ValidationErrors
			if !errors.As(err, &ve) || ve.OverCap() {
				t.Errorf("%s with %q: got %v, want a malformed-request ValidationError", field, bad.text, err)
				continue
			}
			i := slices.IndexFunc(ve, func(v *budget.ValidationError) bool {
				return v.Field == field && strings.Contains(v.Reason, bad.want)
			})
			if i < 0 {
				t.Errorf("%s with %q: violations %+v, want one of %s saying %q", field, bad.text, ve, field, bad.want)
			}
		}
	}
}

// TestValidateAcceptsUTF8 is the positive control: multi-byte UTF-8 is
// fine anywhere free text goes, and length limits still count bytes.
func TestValidateAcceptsUTF8(t *testing.T) {
	t.Parallel()
	cfg := orchestrator.Config{KnownTools: []string{"search", "fetch"}}
	s := validSpec()
	s.IdempotencyKey = "clé-🔑"
	s.TenantId = "société"
	s.Goal = "trouver des faits — 事実を探す"
	s.Tasks[3].Instruction = "überprüfe ✓"
	s.Tasks[5].Id = strings.Repeat("é", 32) // 64 bytes, the limit
	s.Model.Model = "modèle"
	s.Labels = map[string]string{strings.Repeat("ü", 31) + "x": "värde 😀"} // a 63-byte key
	if err := cfg.Validate(s); err != nil {
		t.Errorf("valid UTF-8 refused: %v", err)
	}
	s.Tasks[5].Id += "x" // 65 bytes
	if err := cfg.Validate(s); err == nil || !strings.Contains(err.Error(), "spec.tasks[5].id: must be at most 64 bytes, got 65") {
		t.Errorf("65-byte task id: got %v, want the byte limit named", err)
	}
}

// TestTextCasesCoverEveryStringField keeps textCases complete: a string
// field added to RunSpec (or to a message it holds) needs a case.
func TestTextCasesCoverEveryStringField(t *testing.T) {
	t.Parallel()
	covered := map[protoreflect.FullName]bool{}
	for _, tc := range textCases() {
		covered[tc.proto] = true
	}
	seen := map[protoreflect.FullName]bool{}
	var walk func(md protoreflect.MessageDescriptor)
	walk = func(md protoreflect.MessageDescriptor) {
		if seen[md.FullName()] {
			return
		}
		seen[md.FullName()] = true
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			leaves := []protoreflect.FieldDescriptor{fd}
			if fd.IsMap() {
				leaves = []protoreflect.FieldDescriptor{fd.MapKey(), fd.MapValue()}
			}
			for _, l := range leaves {
				switch l.Kind() {
				case protoreflect.StringKind:
					if !covered[l.FullName()] {
						t.Errorf("string field %s has no text case", l.FullName())
					}
				case protoreflect.MessageKind, protoreflect.GroupKind:
					walk(l.Message())
				}
			}
		}
	}
	walk((&fanoutv1.RunSpec{}).ProtoReflect().Descriptor())
	if len(covered) < 11 {
		t.Errorf("only %d string fields covered", len(covered))
	}
}

// eachString calls f with every string in m, at any depth, map keys
// included.
func eachString(m protoreflect.Message, f func(string)) {
	visit := func(fd protoreflect.FieldDescriptor, v protoreflect.Value) {
		switch fd.Kind() {
		case protoreflect.StringKind:
			f(v.String())
		case protoreflect.MessageKind, protoreflect.GroupKind:
			eachString(v.Message(), f)
		}
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				visit(fd.MapKey(), k.Value())
				visit(fd.MapValue(), mv)
				return true
			})
		case fd.IsList():
			for i := range v.List().Len() {
				visit(fd, v.List().Get(i))
			}
		default:
			visit(fd, v)
		}
		return true
	})
}

// TestReadRPCsRejectNUL: the other RPCs' strings reach PostgreSQL and logs
// too; a NUL in any of them is INVALID_ARGUMENT naming the field, not
// Internal.
func TestReadRPCsRejectNUL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := b.orchestrator(t, "v1", orchestrator.Config{})
	ctx := t.Context()
	_, err := n.client.GetRun(ctx, &fanoutv1.GetRunRequest{RunId: "r\x00"})
	checkTextViolation(t, "GetRun", err, "run_id", "must not contain NUL bytes")
	_, err = n.client.CancelRun(ctx, &fanoutv1.CancelRunRequest{RunId: "r\x00"})
	checkTextViolation(t, "CancelRun run_id", err, "run_id", "must not contain NUL bytes")
	_, err = n.client.CancelRun(ctx, &fanoutv1.CancelRunRequest{RunId: "r", Reason: "enough\x00"})
	checkTextViolation(t, "CancelRun reason", err, "reason", "must not contain NUL bytes")
	_, err = n.client.ListRuns(ctx, &fanoutv1.ListRunsRequest{TenantId: "acme\x00"})
	checkTextViolation(t, "ListRuns", err, "tenant_id", "must not contain NUL bytes")
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := n.client.WatchRun(wctx, &fanoutv1.WatchRunRequest{RunId: "r\x00"})
	if err == nil {
		_, err = stream.Recv()
	}
	checkTextViolation(t, "WatchRun", err, "run_id", "must not contain NUL bytes")
	if _, err := n.client.ListRuns(ctx, &fanoutv1.ListRunsRequest{}); err != nil {
		t.Errorf("server stopped serving: %v", err)
	}
}
