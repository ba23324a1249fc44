package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// The documents in jsonb columns (run.spec, run.result, task.outcome,
// run_event.event) are the store's own records, below: Go structs whose
// JSON names are written out in their tags, mapped from and to the API's
// messages by the functions beside them, at the store's edge. So renaming
// or renumbering a field or an enum value of the API changes nothing
// stored; a new field is stored once its record has it (records_test.go
// fails until then).
//
// Their shape is the one the store wrote before it had records, protojson
// with the proto field names, so that rows written then read back the
// same and SQL reads them as it did (spec->>'goal', the generated column
// task.outcome_error, outcome->'summary'->>'error'): snake_case names; a
// zero scalar, an empty list or map and an unset message left out; int64
// as a JSON string ("42"); enums by their value names
// ("TASK_STATUS_FAILED"); Timestamp and Duration as protojson's strings
// ("2024-05-01T10:00:00.250Z", "1.5s"). Unknown names are skipped on read
// (a newer binary wrote them).

// encodeSpec, encodeOutcome, encodeResult and encodeEvent encode a message
// as its record for a jsonb column; a nil message is {}.
func encodeSpec(m *fanoutv1.RunSpec) ([]byte, error) { return encodeRecord(m, specRecordOf(m)) }

func encodeOutcome(m *fanoutv1.TaskOutcome) ([]byte, error) {
	return encodeRecord(m, outcomeRecordOf(m))
}

func encodeResult(m *fanoutv1.JoinedResult) ([]byte, error) {
	return encodeRecord(m, resultRecordOf(m))
}

func encodeEvent(m *fanoutv1.RunEvent) ([]byte, error) {
	r := eventRecordOf(m)
	if m.GetEvent() != nil && !r.set() {
		return nil, fmt.Errorf("no record for an event %T", m.GetEvent())
	}
	return encodeRecord(m, r)
}

// decodeSpec, decodeOutcome, decodeResult and decodeEvent read a jsonb
// column's record into its message.
func decodeSpec(b []byte) (*fanoutv1.RunSpec, error) { return decodeRecord(b, (*specRecord).proto) }

func decodeOutcome(b []byte) (*fanoutv1.TaskOutcome, error) {
	return decodeRecord(b, (*outcomeRecord).proto)
}

func decodeResult(b []byte) (*fanoutv1.JoinedResult, error) {
	return decodeRecord(b, (*resultRecord).proto)
}

func decodeEvent(b []byte) (*fanoutv1.RunEvent, error) { return decodeRecord(b, (*eventRecord).proto) }

func encodeRecord(m proto.Message, r any) ([]byte, error) {
	if m == nil || !m.ProtoReflect().IsValid() {
		return []byte("{}"), nil
	}
	// protojson refused a string that is not UTF-8; encoding/json would
	// store U+FFFD instead of the bad bytes.
	if err := checkUTF8(m.ProtoReflect()); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // "<" as "<", not "\u003c", as protojson wrote it
	if err := enc.Encode(r); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

func decodeRecord[R, M any](b []byte, message func(*R) *M) (*M, error) {
	r := new(R)
	if err := json.Unmarshal(b, r); err != nil {
		return nil, err
	}
	return message(r), nil
}

func checkUTF8(m protoreflect.Message) (err error) {
	check := func(fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
		switch fd.Kind() {
		case protoreflect.StringKind:
			if !utf8.ValidString(v.String()) {
				return fmt.Errorf("field %s holds invalid UTF-8", fd.FullName())
			}
		case protoreflect.MessageKind:
			return checkUTF8(v.Message())
		}
		return nil
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			for i := 0; i < v.List().Len() && err == nil; i++ {
				err = check(fd, v.List().Get(i))
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
				if err = check(fd.MapKey(), k.Value()); err == nil {
					err = check(fd.MapValue(), v)
				}
				return err == nil
			})
		default:
			err = check(fd, v)
		}
		return err == nil
	})
	return err
}

// each maps a list of messages or records; an element that maps to nil
// (a nil element) is an empty one, as protojson wrote it ({}).
func each[T, U any](in []*T, f func(*T) *U) []*U {
	if len(in) == 0 {
		return nil
	}
	out := make([]*U, len(in))
	for i, x := range in {
		if out[i] = f(x); out[i] == nil {
			out[i] = new(U)
		}
	}
	return out
}

// specRecord is a fanout.v1.RunSpec: run.spec.
type specRecord struct {
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	TenantID       string            `json:"tenant_id,omitempty"`
	Goal           string            `json:"goal,omitempty"`
	Tasks          []*taskSpecRecord `json:"tasks,omitempty"`
	Budget         *budgetRecord     `json:"budget,omitempty"`
	Limits         *limitsRecord     `json:"limits,omitempty"`
	OnExhaustion   exhaustionJSON    `json:"on_exhaustion,omitzero"`
	JoinPolicy     joinPolicyJSON    `json:"join_policy,omitzero"`
	Synthesize     bool              `json:"synthesize,omitempty"`
	Model          *modelRecord      `json:"model,omitempty"`
	Cache          *cacheRecord      `json:"cache,omitempty"`
	FanOut         *fanOutRecord     `json:"fan_out,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
}

func specRecordOf(m *fanoutv1.RunSpec) *specRecord {
	if m == nil {
		return nil
	}
	return &specRecord{IdempotencyKey: m.GetIdempotencyKey(), TenantID: m.GetTenantId(), Goal: m.GetGoal(),
		Tasks: each(m.GetTasks(), taskSpecRecordOf), Budget: budgetRecordOf(m.GetBudget()),
		Limits: limitsRecordOf(m.GetLimits()), OnExhaustion: exhaustionJSON(m.GetOnExhaustion()),
		JoinPolicy: joinPolicyJSON(m.GetJoinPolicy()), Synthesize: m.GetSynthesize(),
		Model: modelRecordOf(m.GetModel()), Cache: cacheRecordOf(m.GetCache()), FanOut: fanOutRecordOf(m.GetFanOut()),
		Labels: m.GetLabels()}
}

func (r *specRecord) proto() *fanoutv1.RunSpec {
	if r == nil {
		return nil
	}
	return &fanoutv1.RunSpec{IdempotencyKey: r.IdempotencyKey, TenantId: r.TenantID, Goal: r.Goal,
		Tasks: each(r.Tasks, (*taskSpecRecord).proto), Budget: r.Budget.proto(), Limits: r.Limits.proto(),
		OnExhaustion: fanoutv1.ExhaustionPolicy(r.OnExhaustion), JoinPolicy: fanoutv1.JoinPolicy(r.JoinPolicy),
		Synthesize: r.Synthesize, Model: r.Model.proto(), Cache: r.Cache.proto(), FanOut: r.FanOut.proto(),
		Labels: r.Labels}
}

// fanOutRecord is a fanout.v1.FanOut.
type fanOutRecord struct {
	MaxDepth      uint32 `json:"max_depth,omitempty"`
	MaxChildTasks uint32 `json:"max_child_tasks,omitempty"`
	MaxTreeTasks  uint32 `json:"max_tree_tasks,omitempty"`
}

func fanOutRecordOf(m *fanoutv1.FanOut) *fanOutRecord {
	if m == nil {
		return nil
	}
	return &fanOutRecord{MaxDepth: m.GetMaxDepth(), MaxChildTasks: m.GetMaxChildTasks(), MaxTreeTasks: m.GetMaxTreeTasks()}
}

func (r *fanOutRecord) proto() *fanoutv1.FanOut {
	if r == nil {
		return nil
	}
	return &fanoutv1.FanOut{MaxDepth: r.MaxDepth, MaxChildTasks: r.MaxChildTasks, MaxTreeTasks: r.MaxTreeTasks}
}

// cacheRecord is a fanout.v1.CacheSettings.
type cacheRecord struct {
	TaskMaxAge *durationJSON `json:"task_max_age,omitempty"`
	Tools      bool          `json:"tools,omitempty"`
}

func cacheRecordOf(m *fanoutv1.CacheSettings) *cacheRecord {
	if m == nil {
		return nil
	}
	return &cacheRecord{TaskMaxAge: durationOf(m.GetTaskMaxAge()), Tools: m.GetTools()}
}

func (r *cacheRecord) proto() *fanoutv1.CacheSettings {
	if r == nil {
		return nil
	}
	return &fanoutv1.CacheSettings{TaskMaxAge: r.TaskMaxAge.proto(), Tools: r.Tools}
}

// taskSpecRecord is a fanout.v1.TaskSpec.
type taskSpecRecord struct {
	ID            string        `json:"id,omitempty"`
	Instruction   string        `json:"instruction,omitempty"`
	TokenBudget   int64JSON     `json:"token_budget,omitzero"`
	MaxIterations int32         `json:"max_iterations,omitempty"`
	AllowedTools  []string      `json:"allowed_tools,omitempty"`
	DependsOn     []string      `json:"depends_on,omitempty"`
	Timeout       *durationJSON `json:"timeout,omitempty"`
	Hedge         *hedgeRecord  `json:"hedge,omitempty"`
}

// hedgeRecord is a fanout.v1.Hedge.
type hedgeRecord struct {
	LatencyFactor doubleJSON    `json:"latency_factor,omitzero"`
	MinPeers      int32         `json:"min_peers,omitempty"`
	After         *durationJSON `json:"after,omitempty"`
}

func hedgeRecordOf(m *fanoutv1.Hedge) *hedgeRecord {
	if m == nil {
		return nil
	}
	return &hedgeRecord{LatencyFactor: doubleJSON(m.GetLatencyFactor()), MinPeers: m.GetMinPeers(), After: durationOf(m.GetAfter())}
}

func (r *hedgeRecord) proto() *fanoutv1.Hedge {
	if r == nil {
		return nil
	}
	return &fanoutv1.Hedge{LatencyFactor: float64(r.LatencyFactor), MinPeers: r.MinPeers, After: r.After.proto()}
}

// hedgeReportRecord is a fanout.v1.HedgeReport.
type hedgeReportRecord struct {
	Winner       hedgeAttemptJSON `json:"winner,omitzero"`
	FirstTokens  int64JSON        `json:"first_tokens,omitzero"`
	HedgeTokens  int64JSON        `json:"hedge_tokens,omitzero"`
	HedgeWorker  string           `json:"hedge_worker,omitempty"`
	StartedAfter *durationJSON    `json:"started_after,omitempty"`
}

func hedgeReportRecordOf(m *fanoutv1.HedgeReport) *hedgeReportRecord {
	if m == nil {
		return nil
	}
	return &hedgeReportRecord{Winner: hedgeAttemptJSON(m.GetWinner()), FirstTokens: int64JSON(m.GetFirstTokens()),
		HedgeTokens: int64JSON(m.GetHedgeTokens()), HedgeWorker: m.GetHedgeWorker(), StartedAfter: durationOf(m.GetStartedAfter())}
}

func (r *hedgeReportRecord) proto() *fanoutv1.HedgeReport {
	if r == nil {
		return nil
	}
	return &fanoutv1.HedgeReport{Winner: fanoutv1.HedgeAttempt(r.Winner), FirstTokens: int64(r.FirstTokens),
		HedgeTokens: int64(r.HedgeTokens), HedgeWorker: r.HedgeWorker, StartedAfter: r.StartedAfter.proto()}
}

func taskSpecRecordOf(m *fanoutv1.TaskSpec) *taskSpecRecord {
	if m == nil {
		return nil
	}
	return &taskSpecRecord{ID: m.GetId(), Instruction: m.GetInstruction(), TokenBudget: int64JSON(m.GetTokenBudget()),
		MaxIterations: m.GetMaxIterations(), AllowedTools: m.GetAllowedTools(), DependsOn: m.GetDependsOn(),
		Timeout: durationOf(m.GetTimeout()), Hedge: hedgeRecordOf(m.GetHedge())}
}

func (r *taskSpecRecord) proto() *fanoutv1.TaskSpec {
	if r == nil {
		return nil
	}
	return &fanoutv1.TaskSpec{Id: r.ID, Instruction: r.Instruction, TokenBudget: int64(r.TokenBudget),
		MaxIterations: r.MaxIterations, AllowedTools: r.AllowedTools, DependsOn: r.DependsOn,
		Timeout: r.Timeout.proto(), Hedge: r.Hedge.proto()}
}

// budgetRecord is a fanout.v1.Budget.
type budgetRecord struct {
	LimitTokens          int64JSON     `json:"limit_tokens,omitzero"`
	MinReservationTokens int64JSON     `json:"min_reservation_tokens,omitzero"`
	SynthesisTokens      int64JSON     `json:"synthesis_tokens,omitzero"`
	Admission            admissionJSON `json:"admission,omitzero"`
}

func budgetRecordOf(m *fanoutv1.Budget) *budgetRecord {
	if m == nil {
		return nil
	}
	return &budgetRecord{LimitTokens: int64JSON(m.GetLimitTokens()), MinReservationTokens: int64JSON(m.GetMinReservationTokens()),
		SynthesisTokens: int64JSON(m.GetSynthesisTokens()), Admission: admissionJSON(m.GetAdmission())}
}

func (r *budgetRecord) proto() *fanoutv1.Budget {
	if r == nil {
		return nil
	}
	return &fanoutv1.Budget{LimitTokens: int64(r.LimitTokens), MinReservationTokens: int64(r.MinReservationTokens),
		SynthesisTokens: int64(r.SynthesisTokens), Admission: fanoutv1.AdmissionPolicy(r.Admission)}
}

// limitsRecord is a fanout.v1.Limits.
type limitsRecord struct {
	MaxConcurrency int32         `json:"max_concurrency,omitempty"`
	RunTimeout     *durationJSON `json:"run_timeout,omitempty"`
}

func limitsRecordOf(m *fanoutv1.Limits) *limitsRecord {
	if m == nil {
		return nil
	}
	return &limitsRecord{MaxConcurrency: m.GetMaxConcurrency(), RunTimeout: durationOf(m.GetRunTimeout())}
}

func (r *limitsRecord) proto() *fanoutv1.Limits {
	if r == nil {
		return nil
	}
	return &fanoutv1.Limits{MaxConcurrency: r.MaxConcurrency, RunTimeout: r.RunTimeout.proto()}
}

// modelRecord is a fanout.v1.ModelSettings.
type modelRecord struct {
	Provider        string     `json:"provider,omitempty"`
	Model           string     `json:"model,omitempty"`
	Temperature     doubleJSON `json:"temperature,omitzero"`
	MaxOutputTokens int32      `json:"max_output_tokens,omitempty"`
	Seed            int64JSON  `json:"seed,omitzero"`
}

func modelRecordOf(m *fanoutv1.ModelSettings) *modelRecord {
	if m == nil {
		return nil
	}
	return &modelRecord{Provider: m.GetProvider(), Model: m.GetModel(), Temperature: doubleJSON(m.GetTemperature()),
		MaxOutputTokens: m.GetMaxOutputTokens(), Seed: int64JSON(m.GetSeed())}
}

func (r *modelRecord) proto() *fanoutv1.ModelSettings {
	if r == nil {
		return nil
	}
	return &fanoutv1.ModelSettings{Provider: r.Provider, Model: r.Model, Temperature: float64(r.Temperature),
		MaxOutputTokens: r.MaxOutputTokens, Seed: int64(r.Seed)}
}

// factRecord is a fanout.v1.Fact.
type factRecord struct {
	Text    string   `json:"text,omitempty"`
	Sources []string `json:"sources,omitempty"`
}

func factRecordOf(m *fanoutv1.Fact) *factRecord {
	if m == nil {
		return nil
	}
	return &factRecord{Text: m.GetText(), Sources: m.GetSources()}
}

func (r *factRecord) proto() *fanoutv1.Fact {
	if r == nil {
		return nil
	}
	return &fanoutv1.Fact{Text: r.Text, Sources: r.Sources}
}

// summaryRecord is a fanout.v1.FactSummary.
type summaryRecord struct {
	Facts       []*factRecord  `json:"facts,omitempty"`
	Tried       []string       `json:"tried,omitempty"`
	Failed      []string       `json:"failed,omitempty"`
	TokensSpent int64JSON      `json:"tokens_spent,omitzero"`
	Iterations  int32          `json:"iterations,omitempty"`
	Status      taskStatusJSON `json:"status,omitzero"`
	Error       string         `json:"error,omitempty"` // task.outcome_error
	WoundDown   bool           `json:"wound_down,omitempty"`
	PeakTokens  int64JSON      `json:"peak_tokens,omitzero"`
}

func summaryRecordOf(m *fanoutv1.FactSummary) *summaryRecord {
	if m == nil {
		return nil
	}
	return &summaryRecord{Facts: each(m.GetFacts(), factRecordOf), Tried: m.GetTried(), Failed: m.GetFailed(),
		TokensSpent: int64JSON(m.GetTokensSpent()), Iterations: m.GetIterations(),
		Status: taskStatusJSON(m.GetStatus()), Error: m.GetError(), WoundDown: m.GetWoundDown(),
		PeakTokens: int64JSON(m.GetPeakTokens())}
}

func (r *summaryRecord) proto() *fanoutv1.FactSummary {
	if r == nil {
		return nil
	}
	return &fanoutv1.FactSummary{Facts: each(r.Facts, (*factRecord).proto), Tried: r.Tried, Failed: r.Failed,
		TokensSpent: int64(r.TokensSpent), Iterations: r.Iterations, Status: fanoutv1.TaskStatus(r.Status),
		Error: r.Error, WoundDown: r.WoundDown, PeakTokens: int64(r.PeakTokens)}
}

// outcomeRecord is a fanout.v1.TaskOutcome: task.outcome (without its
// times, which are columns), and a task in a result or an event.
type outcomeRecord struct {
	TaskID         string             `json:"task_id,omitempty"`
	DispatchIndex  int32              `json:"dispatch_index,omitempty"`
	Status         taskStatusJSON     `json:"status,omitzero"`
	Summary        *summaryRecord     `json:"summary,omitempty"`
	TokensSpent    int64JSON          `json:"tokens_spent,omitzero"`
	Worker         string             `json:"worker,omitempty"`
	StartedAt      *timestampJSON     `json:"started_at,omitempty"`
	FinishedAt     *timestampJSON     `json:"finished_at,omitempty"`
	ForecastTokens int64JSON          `json:"forecast_tokens,omitzero"`
	Hedge          *hedgeReportRecord `json:"hedge,omitempty"`
	Reused         *reusedRecord      `json:"reused,omitempty"`
}

func outcomeRecordOf(m *fanoutv1.TaskOutcome) *outcomeRecord {
	if m == nil {
		return nil
	}
	return &outcomeRecord{TaskID: m.GetTaskId(), DispatchIndex: m.GetDispatchIndex(),
		Status: taskStatusJSON(m.GetStatus()), Summary: summaryRecordOf(m.GetSummary()),
		TokensSpent: int64JSON(m.GetTokensSpent()), Worker: m.GetWorker(),
		StartedAt: timestampOf(m.GetStartedAt()), FinishedAt: timestampOf(m.GetFinishedAt()),
		ForecastTokens: int64JSON(m.GetForecastTokens()), Hedge: hedgeReportRecordOf(m.GetHedge()),
		Reused: reusedRecordOf(m.GetReused())}
}

func (r *outcomeRecord) proto() *fanoutv1.TaskOutcome {
	if r == nil {
		return nil
	}
	return &fanoutv1.TaskOutcome{TaskId: r.TaskID, DispatchIndex: r.DispatchIndex,
		Status: fanoutv1.TaskStatus(r.Status), Summary: r.Summary.proto(), TokensSpent: int64(r.TokensSpent),
		Worker: r.Worker, StartedAt: r.StartedAt.proto(), FinishedAt: r.FinishedAt.proto(),
		ForecastTokens: int64(r.ForecastTokens), Hedge: r.Hedge.proto(), Reused: r.Reused.proto()}
}

// reusedRecord is a fanout.v1.ReusedFrom.
type reusedRecord struct {
	RunID       string         `json:"run_id,omitempty"`
	TaskID      string         `json:"task_id,omitempty"`
	Via         string         `json:"via,omitempty"`
	FinishedAt  *timestampJSON `json:"finished_at,omitempty"`
	TokensSaved int64JSON      `json:"tokens_saved,omitzero"`
	Writes      int32          `json:"writes,omitempty"`
}

func reusedRecordOf(m *fanoutv1.ReusedFrom) *reusedRecord {
	if m == nil {
		return nil
	}
	return &reusedRecord{RunID: m.GetRunId(), TaskID: m.GetTaskId(), Via: m.GetVia(),
		FinishedAt: timestampOf(m.GetFinishedAt()), TokensSaved: int64JSON(m.GetTokensSaved()), Writes: m.GetWrites()}
}

func (r *reusedRecord) proto() *fanoutv1.ReusedFrom {
	if r == nil {
		return nil
	}
	return &fanoutv1.ReusedFrom{RunId: r.RunID, TaskId: r.TaskID, Via: r.Via, FinishedAt: r.FinishedAt.proto(),
		TokensSaved: int64(r.TokensSaved), Writes: r.Writes}
}

// snapshotRecord is a fanout.v1.BudgetSnapshot.
type snapshotRecord struct {
	LimitTokens     int64JSON `json:"limit_tokens,omitzero"`
	AvailableTokens int64JSON `json:"available_tokens,omitzero"`
	ReservedTokens  int64JSON `json:"reserved_tokens,omitzero"`
	SpentTokens     int64JSON `json:"spent_tokens,omitzero"`
	Exhausted       bool      `json:"exhausted,omitempty"`
	HeldTokens      int64JSON `json:"held_tokens,omitzero"`
}

func snapshotRecordOf(m *fanoutv1.BudgetSnapshot) *snapshotRecord {
	if m == nil {
		return nil
	}
	return &snapshotRecord{LimitTokens: int64JSON(m.GetLimitTokens()), AvailableTokens: int64JSON(m.GetAvailableTokens()),
		ReservedTokens: int64JSON(m.GetReservedTokens()), SpentTokens: int64JSON(m.GetSpentTokens()),
		Exhausted: m.GetExhausted(), HeldTokens: int64JSON(m.GetHeldTokens())}
}

func (r *snapshotRecord) proto() *fanoutv1.BudgetSnapshot {
	if r == nil {
		return nil
	}
	return &fanoutv1.BudgetSnapshot{LimitTokens: int64(r.LimitTokens), AvailableTokens: int64(r.AvailableTokens),
		ReservedTokens: int64(r.ReservedTokens), SpentTokens: int64(r.SpentTokens), Exhausted: r.Exhausted,
		HeldTokens: int64(r.HeldTokens)}
}

// resultRecord is a fanout.v1.JoinedResult: run.result.
type resultRecord struct {
	Facts                  []*factRecord    `json:"facts,omitempty"`
	Tasks                  []*outcomeRecord `json:"tasks,omitempty"`
	TotalTokens            int64JSON        `json:"total_tokens,omitzero"`
	Synthesis              string           `json:"synthesis,omitempty"`
	SynthesisSkippedReason string           `json:"synthesis_skipped_reason,omitempty"`
	// Set only on a result cut at the API's edge (orchestrator/pages.go),
	// never on one stored; kept so that a record is its message whole.
	FactCount          int32  `json:"fact_count,omitempty"`
	FactsNextPageToken string `json:"facts_next_page_token,omitempty"`
	TaskCount          int32  `json:"task_count,omitempty"`
	TasksNextPageToken string `json:"tasks_next_page_token,omitempty"`
}

func resultRecordOf(m *fanoutv1.JoinedResult) *resultRecord {
	if m == nil {
		return nil
	}
	return &resultRecord{Facts: each(m.GetFacts(), factRecordOf), Tasks: each(m.GetTasks(), outcomeRecordOf),
		TotalTokens: int64JSON(m.GetTotalTokens()), Synthesis: m.GetSynthesis(),
		SynthesisSkippedReason: m.GetSynthesisSkippedReason(), FactCount: m.GetFactCount(),
		FactsNextPageToken: m.GetFactsNextPageToken(), TaskCount: m.GetTaskCount(), TasksNextPageToken: m.GetTasksNextPageToken()}
}

func (r *resultRecord) proto() *fanoutv1.JoinedResult {
	if r == nil {
		return nil
	}
	return &fanoutv1.JoinedResult{Facts: each(r.Facts, (*factRecord).proto), Tasks: each(r.Tasks, (*outcomeRecord).proto),
		TotalTokens: int64(r.TotalTokens), Synthesis: r.Synthesis, SynthesisSkippedReason: r.SynthesisSkippedReason,
		FactCount: r.FactCount, FactsNextPageToken: r.FactsNextPageToken, TaskCount: r.TaskCount,
		TasksNextPageToken: r.TasksNextPageToken}
}

// runRecord is a fanout.v1.Run, in a RunStarted event.
type runRecord struct {
	RunID          string           `json:"run_id,omitempty"`
	TenantID       string           `json:"tenant_id,omitempty"`
	IdempotencyKey string           `json:"idempotency_key,omitempty"`
	State          runStateJSON     `json:"state,omitzero"`
	CancelCause    string           `json:"cancel_cause,omitempty"`
	Spec           *specRecord      `json:"spec,omitempty"`
	Budget         *snapshotRecord  `json:"budget,omitempty"`
	Tasks          []*outcomeRecord `json:"tasks,omitempty"`
	Result         *resultRecord    `json:"result,omitempty"`
	// Set only on a run cut at the API's edge, as resultRecord's.
	TaskCount          int32             `json:"task_count,omitempty"`
	TasksNextPageToken string            `json:"tasks_next_page_token,omitempty"`
	SpecCut            bool              `json:"spec_cut,omitempty"`
	CreatedAt          *timestampJSON    `json:"created_at,omitempty"`
	FinishedAt         *timestampJSON    `json:"finished_at,omitempty"`
	Labels             map[string]string `json:"labels,omitempty"`
	ForkedFrom         string            `json:"forked_from,omitempty"`
	ParentRunID        string            `json:"parent_run_id,omitempty"`
	ParentTaskID       string            `json:"parent_task_id,omitempty"`
	RootRunID          string            `json:"root_run_id,omitempty"`
	Depth              int32             `json:"depth,omitempty"`

	// Set by GetRun only (Run.concurrency), never stored with a run.
	Concurrency *concurrencyChosenRecord `json:"concurrency,omitempty"`

	// A continued run's (docs/budget.md#continue).
	Continuations int32          `json:"continuations,omitempty"`
	AddedTokens   int64JSON      `json:"added_tokens,omitzero"`
	ContinuedAt   *timestampJSON `json:"continued_at,omitempty"`
}

func runRecordOf(m *fanoutv1.Run) *runRecord {
	if m == nil {
		return nil
	}
	return &runRecord{RunID: m.GetRunId(), TenantID: m.GetTenantId(), IdempotencyKey: m.GetIdempotencyKey(),
		State: runStateJSON(m.GetState()), CancelCause: m.GetCancelCause(), Spec: specRecordOf(m.GetSpec()),
		Budget: snapshotRecordOf(m.GetBudget()), Tasks: each(m.GetTasks(), outcomeRecordOf),
		Result: resultRecordOf(m.GetResult()), TaskCount: m.GetTaskCount(), TasksNextPageToken: m.GetTasksNextPageToken(),
		SpecCut: m.GetSpecCut(), CreatedAt: timestampOf(m.GetCreatedAt()),
		FinishedAt: timestampOf(m.GetFinishedAt()), Labels: m.GetLabels(), ForkedFrom: m.GetForkedFrom(),
		Concurrency:   concurrencyRecordOf(m.GetConcurrency()),
		Continuations: m.GetContinuations(), AddedTokens: int64JSON(m.GetAddedTokens()),
		ContinuedAt: timestampOf(m.GetContinuedAt()), ParentRunID: m.GetParentRunId(), ParentTaskID: m.GetParentTaskId(),
		RootRunID: m.GetRootRunId(), Depth: m.GetDepth()}
}

func (r *runRecord) proto() *fanoutv1.Run {
	if r == nil {
		return nil
	}
	return &fanoutv1.Run{RunId: r.RunID, TenantId: r.TenantID, IdempotencyKey: r.IdempotencyKey,
		State: fanoutv1.RunState(r.State), CancelCause: r.CancelCause, Spec: r.Spec.proto(), Budget: r.Budget.proto(),
		Tasks: each(r.Tasks, (*outcomeRecord).proto), Result: r.Result.proto(), TaskCount: r.TaskCount,
		TasksNextPageToken: r.TasksNextPageToken, SpecCut: r.SpecCut, CreatedAt: r.CreatedAt.proto(),
		FinishedAt: r.FinishedAt.proto(), Labels: r.Labels, ForkedFrom: r.ForkedFrom, Concurrency: r.Concurrency.proto(),
		Continuations: r.Continuations, AddedTokens: int64(r.AddedTokens), ContinuedAt: r.ContinuedAt.proto(),
		ParentRunId: r.ParentRunID, ParentTaskId: r.ParentTaskID, RootRunId: r.RootRunID, Depth: r.Depth}
}
