package orchestrator_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// badCase is one malformed or oversized request.
type badCase struct {
	name   string
	mutate func(s *fanoutv1.RunSpec)
	code   codes.Code
	field  string // a field violation must name exactly this path
}

// badCases returns 200 bad requests: each kind of mistake, on several tasks.
func badCases() []badCase {
	var cases []badCase
	add := func(name string, code codes.Code, field string, f func(s *fanoutv1.RunSpec)) {
		cases = append(cases, badCase{name: name, mutate: f, code: code, field: field})
	}
	inv := codes.InvalidArgument
	// Run-level mistakes.
	add("no key", inv, "spec.idempotency_key", func(s *fanoutv1.RunSpec) { s.IdempotencyKey = "" })
	add("long key", inv, "spec.idempotency_key", func(s *fanoutv1.RunSpec) { s.IdempotencyKey = strings.Repeat("k", 129) })
	add("long tenant", inv, "spec.tenant_id", func(s *fanoutv1.RunSpec) { s.TenantId = strings.Repeat("t", 129) })
	add("no tasks", inv, "spec.tasks", func(s *fanoutv1.RunSpec) { s.Tasks = nil })
	add("no budget", inv, "spec.budget.limit_tokens", func(s *fanoutv1.RunSpec) { s.Budget = nil })
	add("negative min reservation", inv, "spec.budget.min_reservation_tokens", func(s *fanoutv1.RunSpec) { s.Budget.MinReservationTokens = -1 })
	add("negative synthesis tokens", inv, "spec.budget.synthesis_tokens", func(s *fanoutv1.RunSpec) {
		s.Synthesize, s.Budget.SynthesisTokens = true, -1
	})
	add("synthesis tokens without synthesis", inv, "spec.budget.synthesis_tokens", func(s *fanoutv1.RunSpec) {
		s.Synthesize, s.Budget.SynthesisTokens = false, 100
	})
	add("synthesis tokens leave the tasks less than the minimum", inv, "spec.budget.synthesis_tokens", func(s *fanoutv1.RunSpec) {
		s.Synthesize, s.Budget.SynthesisTokens = true, s.Budget.LimitTokens
	})
	add("negative concurrency", inv, "spec.limits.max_concurrency", func(s *fanoutv1.RunSpec) {
		s.Limits = &fanoutv1.Limits{MaxConcurrency: -1}
	})
	add("zero run timeout", inv, "spec.limits.run_timeout", func(s *fanoutv1.RunSpec) {
		s.Limits = &fanoutv1.Limits{RunTimeout: durationpb.New(0)}
	})
	add("invalid run timeout", inv, "spec.limits.run_timeout", func(s *fanoutv1.RunSpec) {
		s.Limits = &fanoutv1.Limits{RunTimeout: &durationpb.Duration{Seconds: 1, Nanos: -1}}
	})
	add("unknown exhaustion policy", inv, "spec.on_exhaustion", func(s *fanoutv1.RunSpec) { s.OnExhaustion = 9 })
	add("unknown join policy", inv, "spec.join_policy", func(s *fanoutv1.RunSpec) { s.JoinPolicy = 9 })
	add("unknown admission policy", inv, "spec.budget.admission", func(s *fanoutv1.RunSpec) { s.Budget.Admission = 9 })
	add("unknown provider", inv, "spec.model.provider", func(s *fanoutv1.RunSpec) { s.Model.Provider = "oracle" })
	add("NaN temperature", inv, "spec.model.temperature", func(s *fanoutv1.RunSpec) { s.Model.Temperature = math.NaN() })
	add("hot temperature", inv, "spec.model.temperature", func(s *fanoutv1.RunSpec) { s.Model.Temperature = 2.5 })
	add("negative output", inv, "spec.model.max_output_tokens", func(s *fanoutv1.RunSpec) { s.Model.MaxOutputTokens = -1 })
	add("empty label key", inv, `spec.labels[""]`, func(s *fanoutv1.RunSpec) { s.Labels = map[string]string{"": "v"} })
	add("long label key", inv, fmt.Sprintf("spec.labels[%q]", strings.Repeat("k", 64)), func(s *fanoutv1.RunSpec) {
		s.Labels = map[string]string{strings.Repeat("k", 64): "v"}
	})
	add("long label value", inv, `spec.labels["k"]`, func(s *fanoutv1.RunSpec) { s.Labels = map[string]string{"k": strings.Repeat("v", 256)} })
	add("too many labels", inv, "spec.labels", func(s *fanoutv1.RunSpec) {
		s.Labels = map[string]string{}
		for i := range 65 {
			s.Labels[fmt.Sprint(i)] = "v"
		}
	})
	add("cycle a->b->a", inv, "spec.tasks", func(s *fanoutv1.RunSpec) {
		s.Tasks[0].DependsOn = []string{"t01"}
		s.Tasks[1].DependsOn = []string{"t00"}
	})
	add("self dependency", inv, "spec.tasks", func(s *fanoutv1.RunSpec) { s.Tasks[3].DependsOn = []string{"t03"} })
	add("long cycle", inv, "spec.tasks", func(s *fanoutv1.RunSpec) {
		for i := range 7 {
			s.Tasks[i].DependsOn = []string{fmt.Sprintf("t%02d", i+1)}
		}
		s.Tasks[7].DependsOn = []string{"t00"}
	})
	// Over a cap: RESOURCE_EXHAUSTED.
	re := codes.ResourceExhausted
	for _, n := range []int{257, 300, 1000, 5000} {
		add(fmt.Sprintf("%d tasks", n), re, "spec.tasks", func(s *fanoutv1.RunSpec) {
			for i := len(s.Tasks); i < n; i++ {
				s.Tasks = append(s.Tasks, &fanoutv1.TaskSpec{Id: fmt.Sprintf("x%d", i), Instruction: "x", TokenBudget: 1})
			}
		})
	}
	add("budget over cap", re, "spec.budget.limit_tokens", func(s *fanoutv1.RunSpec) { s.Budget.LimitTokens = 1e12 })
	add("huge goal", re, "spec", func(s *fanoutv1.RunSpec) { s.Goal = strings.Repeat("g", 5<<20) })
	add("child run's key prefix", inv, "spec.idempotency_key", func(s *fanoutv1.RunSpec) { s.IdempotencyKey = "child:k" })
	// Nested fan-out (docs/budget.md#nested-fan-out), each just past its limit.
	add("fan-out depth 0", inv, "spec.fan_out.max_depth", func(s *fanoutv1.RunSpec) { s.FanOut = &fanoutv1.FanOut{} })
	add("fan-out depth 5", inv, "spec.fan_out.max_depth", func(s *fanoutv1.RunSpec) { s.FanOut = &fanoutv1.FanOut{MaxDepth: 5} })
	add("fan-out child tasks 65", inv, "spec.fan_out.max_child_tasks", func(s *fanoutv1.RunSpec) {
		s.FanOut = &fanoutv1.FanOut{MaxDepth: 1, MaxChildTasks: 65}
	})
	add("fan-out tree tasks 4097", inv, "spec.fan_out.max_tree_tasks", func(s *fanoutv1.RunSpec) {
		s.FanOut = &fanoutv1.FanOut{MaxDepth: 1, MaxTreeTasks: 4097}
	})
	add("fan-out tree smaller than the root", inv, "spec.fan_out.max_tree_tasks", func(s *fanoutv1.RunSpec) {
		s.FanOut = &fanoutv1.FanOut{MaxDepth: 1, MaxTreeTasks: uint32(len(s.Tasks) - 1)}
	})
	add("fan-out with a hedged task", inv, "spec.tasks[3].hedge", func(s *fanoutv1.RunSpec) {
		s.FanOut = &fanoutv1.FanOut{MaxDepth: 1}
		s.Tasks[3].Hedge = &fanoutv1.Hedge{}
	})
	for _, v := range []int64{0, -1, math.MinInt64} {
		add(fmt.Sprintf("limit %d", v), inv, "spec.budget.limit_tokens", func(s *fanoutv1.RunSpec) { s.Budget.LimitTokens = v })
	}
	for _, v := range []int64{1_000_001, 2_000_000, math.MaxInt64} {
		add(fmt.Sprintf("min reservation %d over limit", v), inv, "spec.budget.min_reservation_tokens", func(s *fanoutv1.RunSpec) {
			s.Budget.MinReservationTokens = v
		})
	}

	// Task-level mistakes, each on several tasks.
	type taskMistake struct {
		name  string
		field string // relative to spec.tasks[i]
		f     func(s *fanoutv1.RunSpec, i int)
	}
	mistakes := []taskMistake{
		{"no id", "id", func(s *fanoutv1.RunSpec, i int) { s.Tasks[i].Id = "" }},
		{"long id", "id", func(s *fanoutv1.RunSpec, i int) { s.Tasks[i].Id = strings.Repeat("i", 65) }},
		{"duplicate id", "id", func(s *fanoutv1.RunSpec, i int) { s.Tasks[i].Id = s.Tasks[i-1].Id }},
		{"reserved id", "id", func(s *fanoutv1.RunSpec, i int) { s.Tasks[i].Id = "_synthesis" }},
		{"no instruction", "instruction", func(s *fanoutv1.RunSpec, i int) { s.Tasks[i].Instruction = "" }},
		{"zero budget", "token_budget", func(s *fanoutv1.RunSpec, i int) { s.Tasks[i].TokenBudget = 0 }},
		{"negative budget", "token_budget", func(s *fanoutv1.RunSpec, i int) { s.Tasks[i].TokenBudget = -5 }},
		{"negative iterations", "max_iterations", func(s *fanoutv1.RunSpec, i int) { s.Tasks[i].MaxIterations = -1 }},
		{"iterations over cap", "max_iterations", func(s *fanoutv1.RunSpec, i int) { s.Tasks[i].MaxIterations = 51 }},
		{"unknown tool", "allowed_tools[1]", func(s *fanoutv1.RunSpec, i int) { s.Tasks[i].AllowedTools = []string{"search", "rm -rf"} }},
		{"unknown dependency", "depends_on[0]", func(s *fanoutv1.RunSpec, i int) { s.Tasks[i].DependsOn = []string{"nope"} }},
		{"zero timeout", "timeout", func(s *fanoutv1.RunSpec, i int) { s.Tasks[i].Timeout = durationpb.New(0) }},
		{"negative timeout", "timeout", func(s *fanoutv1.RunSpec, i int) { s.Tasks[i].Timeout = durationpb.New(-1) }},
		{"invalid timeout", "timeout", func(s *fanoutv1.RunSpec, i int) {
			s.Tasks[i].Timeout = &durationpb.Duration{Seconds: -1, Nanos: 1}
		}},
		{"empty tool", "allowed_tools[0]", func(s *fanoutv1.RunSpec, i int) { s.Tasks[i].AllowedTools = []string{""} }},
	}
	for len(cases) < 200 {
		for _, m := range mistakes {
			i := len(cases) % 8
			if m.name == "duplicate id" && i == 0 {
				i = 1 // the later of two equal ids is the one named
			}
			if len(cases) == 200 {
				break
			}
			add(fmt.Sprintf("task %d %s", i, m.name), inv, fmt.Sprintf("spec.tasks[%d].%s", i, m.field),
				func(s *fanoutv1.RunSpec) { m.f(s, i) })
		}
	}
	return cases
}

func validSpec() *fanoutv1.RunSpec {
	s := spec("key", 8, 1_000_000)
	s.Tasks[2].DependsOn = []string{"t00", "t01"}
	s.Tasks[4].AllowedTools = []string{"search", "fetch"}
	return s
}

func TestValidateBadRequests(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := b.orchestrator(t, "v1", orchestrator.Config{MaxRunTokens: 1e9})
	cases := badCases()
	if len(cases) != 200 {
		t.Fatalf("%d cases, want 200", len(cases))
	}
	for _, tc := range cases {
		s := validSpec()
		tc.mutate(s)
		_, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
		st := status.Convert(err)
		if st.Code() != tc.code {
			t.Errorf("%s: code %s (%q), want %s", tc.name, st.Code(), st.Message(), tc.code)
			continue
		}
		var fields []string
		for _, v := range fieldViolations(st) {
			fields = append(fields, v.GetField())
			if v.GetDescription() == "" {
				t.Errorf("%s: violation of %s has no description", tc.name, v.GetField())
			}
		}
		if !slices.Contains(fields, tc.field) {
			t.Errorf("%s: field violations %q do not name %s (message %q)", tc.name, fields, tc.field, st.Message())
		}
		if !strings.Contains(st.Message(), tc.field) {
			t.Errorf("%s: message %q does not name %s", tc.name, st.Message(), tc.field)
		}
	}
	b.checkNothingWritten(t, n)
	// The valid spec passes validation.
	if err := n.engine.Config().Validate(validSpec()); err != nil {
		t.Errorf("valid spec: %v", err)
	}
}

// fieldViolations returns the BadRequest field violations of st.
func fieldViolations(st *status.Status) []*errdetails.BadRequest_FieldViolation {
	var out []*errdetails.BadRequest_FieldViolation
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			out = append(out, br.GetFieldViolations()...)
		}
	}
	return out
}

// checkNothingWritten checks that bad requests reached neither the ledger
// nor the run table, and that n still serves.
func (b *testBundle) checkNothingWritten(t *testing.T, n *node) {
	t.Helper()
	var accounts, runs int
	if err := b.pool.QueryRow(t.Context(), "SELECT (SELECT count(*) FROM account), (SELECT count(*) FROM run)").Scan(&accounts, &runs); err != nil {
		t.Fatal(err)
	}
	if accounts != 0 || runs != 0 {
		t.Errorf("after bad requests: %d accounts, %d runs, want 0 and 0", accounts, runs)
	}
	if _, err := n.client.ListRuns(t.Context(), &fanoutv1.ListRunsRequest{TenantId: "t1"}); err != nil {
		t.Errorf("ListRuns after bad requests: %v", err)
	}
}

func TestValidateCycleNamed(t *testing.T) {
	t.Parallel()
	cfg := orchestrator.Config{}
	s := spec("k", 4, 1000)
	s.Tasks[0].DependsOn = []string{"t01"}
	s.Tasks[1].DependsOn = []string{"t02"}
	s.Tasks[2].DependsOn = []string{"t00"}
	err := cfg.Validate(s)
	if err == nil || !strings.Contains(err.Error(), "dependency cycle t00 -> t01 -> t02 -> t00") {
		t.Errorf("got %v, want the cycle t00 -> t01 -> t02 -> t00 named", err)
	}
	var ve budget.ValidationErrors
	if !errors.As(err, &ve) || ve.OverCap() {
		t.Errorf("got %T %+v, want a malformed-request ValidationError", err, err)
	}
}

func TestPlanBatches(t *testing.T) {
	t.Parallel()
	s := spec("k", 6, 1000)
	// t00, t01 first; t02 needs both; t03 needs t02; t04 needs t00; t05 free.
	s.Tasks[2].DependsOn = []string{"t01", "t00"}
	s.Tasks[3].DependsOn = []string{"t02"}
	s.Tasks[4].DependsOn = []string{"t00", "t00"}
	got, err := orchestrator.Config{}.Plan(s)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int{{0, 1, 5}, {2, 4}, {3}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("batches %v, want %v", got, want)
	}
}

// FuzzValidate feeds random RunSpec bytes to validation: it must never panic,
// and whatever it accepts must satisfy the contract's basic limits and hold
// only text PostgreSQL stores (no NUL, valid UTF-8).
func FuzzValidate(f *testing.F) {
	for _, tc := range badCases()[:40] {
		s := validSpec()
		tc.mutate(s)
		b, _ := proto.Marshal(s)
		f.Add(b)
	}
	for _, tc := range textCases() {
		s := validSpec()
		tc.set(s, "\x00") // invalid UTF-8 does not survive proto.Unmarshal
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	b, _ := proto.Marshal(validSpec())
	f.Add(b)
	cfg := orchestrator.Config{KnownTools: []string{"search", "fetch"}}
	if err := cfg.Validate(validSpec()); err != nil {
		f.Fatalf("the valid seed is refused, so no seed reaches the checks of accepted specs: %v", err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &fanoutv1.RunSpec{}
		if proto.Unmarshal(data, s) != nil {
			return
		}
		err := cfg.Validate(s)
		if err != nil {
			var ve budget.ValidationErrors
			if !errors.As(err, &ve) || len(ve) == 0 {
				t.Fatalf("error %v is not a ValidationError with violations", err)
			}
			return
		}
		if len(s.GetTasks()) == 0 || len(s.GetTasks()) > 256 || s.GetBudget().GetLimitTokens() <= 0 ||
			s.GetIdempotencyKey() == "" {
			t.Fatalf("accepted an invalid spec: %v", s)
		}
		ids := map[string]bool{}
		for _, task := range s.GetTasks() {
			if task.GetId() == "" || ids[task.GetId()] || task.GetTokenBudget() <= 0 {
				t.Fatalf("accepted an invalid task: %v", task)
			}
			ids[task.GetId()] = true
		}
		eachString(s.ProtoReflect(), func(str string) {
			if !utf8.ValidString(str) || strings.IndexByte(str, 0) >= 0 {
				t.Fatalf("accepted a spec holding %q: %v", str, s)
			}
		})
		if _, err := cfg.Plan(s); err != nil {
			t.Fatalf("Plan refused what Validate accepted: %v", err)
		}
	})
}
