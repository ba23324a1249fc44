package subagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/internal/redact"
	"github.com/fanout/fanout/peer"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/subagent/llm"
)

// ErrShuttingDown is the cancel cause of subagents still running when a
// worker's Shutdown deadline passes.
var ErrShuttingDown = errors.New("worker shutting down")

// ErrUnknownProvider is returned by a ModelFunc for a provider it does not serve.
var ErrUnknownProvider = errors.New("unknown model provider")

// ModelFunc returns the model for a request's settings. It returns an error
// wrapping ErrUnknownProvider for a provider it does not serve.
type ModelFunc func(settings *fanoutv1.ModelSettings) (llm.Model, error)

// SimModels returns a ModelFunc that serves provider "sim" (and the empty
// default provider) with sim and refuses every other provider.
func SimModels(sim llm.Model) ModelFunc {
	return func(s *fanoutv1.ModelSettings) (llm.Model, error) {
		if p := s.GetProvider(); p != "" && p != "sim" {
			return nil, fmt.Errorf("select model: %w %q", ErrUnknownProvider, p)
		}
		return sim, nil
	}
}

// ProviderModels returns a ModelFunc that serves each request with the
// model of its ModelSettings.provider ("sim", "openai", "anthropic", ... as
// keyed in models); the empty provider gets models[defaultProvider]. Any
// other provider is refused with ErrUnknownProvider, before anything is
// reserved. The settings' model name reaches the provider through the
// loop's Request.Model.
func ProviderModels(models map[string]llm.Model, defaultProvider string) ModelFunc {
	return func(s *fanoutv1.ModelSettings) (llm.Model, error) {
		p := s.GetProvider()
		if p == "" {
			p = defaultProvider
		}
		if m, ok := models[p]; ok && m != nil {
			return m, nil
		}
		return nil, fmt.Errorf("select model: %w %q", ErrUnknownProvider, p)
	}
}

// ServerConfig configures a worker. Zero values take the documented defaults.
type ServerConfig struct {
	Ledger budget.Ledger // required
	// Keys are the orchestrators' public signing keys: Execute runs only a
	// dispatch signed by one of them. Required.
	Keys    *peer.KeySet
	Watcher *budget.Watcher // run exhaustion/cancel signals; nil = rely on the stream's cancellation only
	// Models selects the model per request; default SimModels with a Sim of
	// default settings.
	Models ModelFunc
	Tools  *Tools // default BuiltinTools()
	// ToolsFunc, if set, is asked for the registry at each Execute instead
	// of Tools: a tool list that changes at run time (an MCP server's
	// notifications/tools/list_changed) reaches the tasks that start after.
	ToolsFunc func() *Tools
	Name      string // worker id, reported in SubagentStarted and holding its reservations; required
	// Capacity is the most subagents running at once; beyond it Execute
	// answers RESOURCE_EXHAUSTED (reason WORKER_FULL). Default 64.
	Capacity        int
	LeaseTTL        time.Duration // default 30s
	MaxIterations   int           // when a task sets none; default 8
	MaxIterCap      int           // the most a task may ask for; default 64
	MaxOutputTokens int           // when a request sets none; default 1024
	// MaxOutputTokensCap is the most a request may ask for; more is
	// INVALID_ARGUMENT before anything is reserved. Default 65,536.
	MaxOutputTokensCap int
	TaskTimeout        time.Duration // when a task sets none; default 10m
	Logger             *slog.Logger  // default slog.Default(); always behind redact.Logger
	// CompressMaxTokens caps the output of the compression call a
	// structured-output model makes at the end of each task; see
	// Loop.CompressMaxTokens. Default 512.
	CompressMaxTokens int
	// CaptureContent puts prompt and completion text on the spans; see
	// Loop.CaptureContent. Default off.
	CaptureContent bool
	// Writes records tool calls with effect write (store.ToolCalls).
	// Required: without it a re-dispatched task could send a write again.
	Writes WriteLog
	// ToolParallelism is the most tool calls in flight on this worker, all
	// tasks together; default 16. ToolTimeout and MaxToolCallsPerTurn are
	// Loop's (defaults DefaultToolTimeout, DefaultMaxToolCallsPerTurn).
	ToolParallelism     int
	ToolTimeout         time.Duration
	MaxToolCallsPerTurn int
	// ToolAllowed says whether a tenant may use a tool (Loop.ToolAllowed);
	// nil allows every tool to every tenant.
	ToolAllowed func(tool, tenant string) bool
	// ApprovalPoll is Loop.ApprovalPoll.
	ApprovalPoll time.Duration
	// ToolCache is the tenants' result cache of read tools (store.ToolCache;
	// Loop.ToolCache), used by the dispatches with cache_tools. nil:
	// nothing is cached.
	ToolCache ToolCache
}

// Server is the worker's SubagentService: it runs one agent Loop per
// Execute call.
type Server struct {
	fanoutv1.UnimplementedSubagentServiceServer

	cfg       ServerConfig
	toolSlots chan struct{} // ToolParallelism, shared by every task
	// loop runs every task dispatched here: built once (newLoop), with its
	// defaults set; each task brings what varies (its model, tools, output
	// allowance, stream).
	loop Loop

	mu       sync.Mutex
	running  int
	inFlight map[string]bool // run/task/attempt of the subagents running
	closing  bool
	unlisted sync.Once // the capacity left fanout.worker.capacity.limit
	wg       sync.WaitGroup
	stop     context.Context // cancelled when Shutdown gives up waiting
	stopFunc context.CancelCauseFunc
}

var _ fanoutv1.SubagentServiceServer = (*Server)(nil)

// DefaultServerConfig returns the ServerConfig whose every knob is its
// documented default, as NewServer fills zero fields; Ledger, Keys,
// Watcher, Models, Tools, Name and Logger stay nil.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{Capacity: 64, LeaseTTL: 30 * time.Second, MaxIterations: 8, MaxIterCap: 64,
		MaxOutputTokens: 1024, MaxOutputTokensCap: 1 << 16, TaskTimeout: 10 * time.Minute, CompressMaxTokens: 512,
		ToolParallelism: 16, ToolTimeout: DefaultToolTimeout, MaxToolCallsPerTurn: DefaultMaxToolCallsPerTurn}
}

// NewServer returns a worker. It fails if a required field is missing.
func NewServer(cfg ServerConfig) (*Server, error) {
	switch {
	case cfg.Ledger == nil:
		return nil, errors.New("new worker: Ledger is required")
	case cfg.Name == "":
		return nil, errors.New("new worker: Name is required")
	case cfg.Keys == nil:
		return nil, errors.New("new worker: Keys (the orchestrators' signing keys) are required")
	case cfg.Writes == nil:
		return nil, errors.New("new worker: Writes (the tool call log) is required")
	}
	if cfg.Models == nil {
		sim, err := llm.NewSim(llm.SimConfig{})
		if err != nil {
			return nil, fmt.Errorf("new worker: %w", err)
		}
		cfg.Models = SimModels(sim)
	}
	if cfg.Tools == nil {
		cfg.Tools = BuiltinTools()
	}
	def := DefaultServerConfig()
	if cfg.Capacity <= 0 {
		cfg.Capacity = def.Capacity
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = def.LeaseTTL
	}
	if cfg.MaxIterations <= 0 {
		cfg.MaxIterations = def.MaxIterations
	}
	if cfg.MaxIterCap <= 0 {
		cfg.MaxIterCap = def.MaxIterCap
	}
	if cfg.MaxOutputTokens <= 0 {
		cfg.MaxOutputTokens = def.MaxOutputTokens
	}
	if cfg.MaxOutputTokensCap <= 0 {
		cfg.MaxOutputTokensCap = def.MaxOutputTokensCap
	}
	if cfg.TaskTimeout <= 0 {
		cfg.TaskTimeout = def.TaskTimeout
	}
	if cfg.CompressMaxTokens <= 0 {
		cfg.CompressMaxTokens = def.CompressMaxTokens
	}
	if cfg.ToolParallelism <= 0 {
		cfg.ToolParallelism = def.ToolParallelism
	}
	if cfg.ToolTimeout <= 0 {
		cfg.ToolTimeout = def.ToolTimeout
	}
	if cfg.MaxToolCallsPerTurn <= 0 {
		cfg.MaxToolCallsPerTurn = def.MaxToolCallsPerTurn
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Logger = redact.Logger(cfg.Logger)
	s := &Server{cfg: cfg, inFlight: map[string]bool{}, toolSlots: make(chan struct{}, cfg.ToolParallelism)}
	s.loop = s.newLoop()
	s.stop, s.stopFunc = context.WithCancelCause(context.Background())
	metrics().capacityLimit.Add(context.Background(), int64(cfg.Capacity))
	return s, nil
}

// Running reports how many subagents are running.
func (s *Server) Running() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running
}

// Execute implements fanoutv1.SubagentServiceServer. It refuses before
// reserving anything: UNAUTHENTICATED for an unsigned envelope or one signed
// by a key not in Keys, PERMISSION_DENIED for a signature that does not
// verify, INVALID_ARGUMENT (with BadRequest field violations) for a
// malformed dispatch, ALREADY_EXISTS for a dispatch (run, task, attempt)
// already running here, UNAVAILABLE (ErrorInfo reason WORKER_DRAINING)
// while shutting down, RESOURCE_EXHAUSTED (ErrorInfo reason WORKER_FULL) at
// capacity. Otherwise the subagent's
// outcome is in the final summary and the stream ends OK.
func (s *Server) Execute(env *fanoutv1.ExecuteRequest, stream grpc.ServerStreamingServer[fanoutv1.ExecuteResponse]) error {
	req, err := s.open(env)
	if err != nil {
		return err
	}
	// The gRPC server span (otelgrpc) is the parent of invoke_agent; name
	// the run and task on it so a refusal is findable too.
	trace.SpanFromContext(stream.Context()).SetAttributes(attrRunID.String(req.GetRunId()),
		attrTaskID.String(req.GetTask().GetId()), attrAttempt.Int(int(req.GetAttempt())))
	if err := s.validate(req); err != nil {
		return err
	}
	model, err := s.cfg.Models(req.GetModel())
	if err != nil {
		return badRequest(violation("model.provider", err.Error()))
	}
	if err := s.acquire(req); err != nil {
		return err
	}
	defer s.release(req)

	ctx, cancel := s.taskContext(stream.Context(), req)
	defer cancel(nil)

	if err := stream.Send(&fanoutv1.ExecuteResponse{Event: &fanoutv1.ExecuteResponse_Started{
		Started: &fanoutv1.SubagentStarted{Worker: s.cfg.Name}}}); err != nil {
		return err // The stream is broken; nothing was reserved.
	}

	sum := s.run(ctx, req, model, stream)
	s.logEnded(ctx, req, sum)
	return stream.Send(&fanoutv1.ExecuteResponse{Event: &fanoutv1.ExecuteResponse_Summary{Summary: sum.Proto()}})
}

// run runs the subagent of req with model, reporting on stream, under the
// run's watcher. It is apart from Execute, as logEnded is, to keep the
// frames of the goroutine that waits on the model small: its stack grows
// to the deepest they reach, and a running subagent holds it.
func (s *Server) run(ctx context.Context, req *fanoutv1.Dispatch, model llm.Model,
	stream grpc.ServerStreamingServer[fanoutv1.ExecuteResponse]) *Summary {
	task := taskFromRequest(req)
	task.Model = model
	task.Tools = s.tools()
	reportOn(stream, task)
	if f := req.GetFanOut(); f != nil {
		task.FanOut = &FanOut{MaxChildTasks: int(f.GetMaxChildTasks()), Park: s.park,
			Ask: func(key string, c FanOutCall) error {
				return stream.Send(&fanoutv1.ExecuteResponse{Event: &fanoutv1.ExecuteResponse_FanOut{
					FanOut: &fanoutv1.SubagentFanOut{Key: key, Goal: c.Goal, Tasks: c.Tasks, TokenBudget: c.TokenBudget}}})
			}}
	}
	if s.cfg.Watcher != nil {
		sub := s.cfg.Watcher.Subscribe(req.GetRunId())
		defer sub.Close()
		task.Watch = sub
		if req.GetDrawOnHeld() {
			task.Watch = cancelOnly{sub}
		}
	}
	return s.loop.run(ctx, task)
}

// logEnded logs how the subagent of req ended.
func (s *Server) logEnded(ctx context.Context, req *fanoutv1.Dispatch, sum *Summary) {
	s.cfg.Logger.InfoContext(ctx, "subagent ended", "run_id", req.GetRunId(), "task_id", req.GetTask().GetId(),
		"status", sum.Status, "tokens", sum.TokensSpent, "iterations", sum.Iterations, "err", sum.Err)
}

// newLoop returns the agent loop of every task this worker runs, with its
// defaults set: what the server's config says, once. The model, the tools
// and the output allowance are each task's (Execute).
func (s *Server) newLoop() Loop {
	loop := &Loop{
		Ledger:              s.cfg.Ledger,
		Tools:               s.cfg.Tools,
		Holder:              s.cfg.Name,
		LeaseTTL:            s.cfg.LeaseTTL,
		MaxIterations:       s.cfg.MaxIterations,
		MaxOutputTokens:     s.cfg.MaxOutputTokens,
		CompressMaxTokens:   s.cfg.CompressMaxTokens,
		Logger:              s.cfg.Logger,
		CaptureContent:      s.cfg.CaptureContent,
		Writes:              s.cfg.Writes,
		ToolSlots:           s.toolSlots,
		ToolTimeout:         s.cfg.ToolTimeout,
		MaxToolCallsPerTurn: s.cfg.MaxToolCallsPerTurn,
		ToolAllowed:         s.cfg.ToolAllowed,
		ApprovalPoll:        s.cfg.ApprovalPoll,
		ToolCache:           s.cfg.ToolCache,
	}
	return loop.defaults()
}

// reportOn has t report its iterations and the writes it waits on for
// approval on stream.
func reportOn(stream grpc.ServerStreamingServer[fanoutv1.ExecuteResponse], t *Task) {
	t.OnApproval = func(w runs.Write) {
		// The orchestrator records it as ApprovalRequested.
		_ = stream.Send(&fanoutv1.ExecuteResponse{Event: &fanoutv1.ExecuteResponse_Approval{
			Approval: &fanoutv1.SubagentApproval{CallId: w.CallID, Tool: w.Tool, Preview: w.Preview,
				Deadline: timestamppb.New(w.ApprovalDeadline)}}})
	}
	t.ProgressFunc = func(p Progress) {
		// A failed send means the client is gone, which cancels ctx.
		_ = stream.Send(&fanoutv1.ExecuteResponse{Event: &fanoutv1.ExecuteResponse_Iteration{
			Iteration: &fanoutv1.SubagentIteration{
				Iteration: int32(p.Iteration), TokensSpent: p.TokensSpent, ToolCalls: int32(p.ToolCalls),
				CachedToolCalls: int32(p.CachedToolCalls), PeakTokens: p.Peak, GrantedTokens: p.Granted, Last: p.Last,
				Waited: durationpb.New(p.Waited)}}})
	}
}

// taskContext derives a subagent's context: the stream's values, cancelled
// with cause budget.ErrRunCancelled when the orchestrator cancels the call (or
// context.DeadlineExceeded when its deadline passes), with ErrShuttingDown
// when Shutdown gives up, and bounded by the task's timeout.
func (s *Server) taskContext(streamCtx context.Context, req *fanoutv1.Dispatch) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(streamCtx))
	stopStream := context.AfterFunc(streamCtx, func() {
		if errors.Is(streamCtx.Err(), context.DeadlineExceeded) {
			cancel(context.DeadlineExceeded)
			return
		}
		cancel(budget.ErrRunCancelled)
	})
	stopShutdown := context.AfterFunc(s.stop, func() { cancel(context.Cause(s.stop)) })
	timeout := s.cfg.TaskTimeout
	if d := req.GetTask().GetTimeout(); d != nil {
		timeout = d.AsDuration()
	}
	tctx, tcancel := context.WithTimeout(ctx, timeout)
	return tctx, func(cause error) {
		stopStream()
		stopShutdown()
		tcancel()
		cancel(cause)
	}
}

// open verifies env's signature and returns the dispatch it carries.
func (s *Server) open(env *fanoutv1.ExecuteRequest) (*fanoutv1.Dispatch, error) {
	if len(env.GetSignature()) == 0 || env.GetKeyId() == "" {
		return nil, status.Error(codes.Unauthenticated, "execute: the dispatch is not signed (signature and key_id are required)")
	}
	switch err := s.cfg.Keys.VerifyDispatch(env.GetKeyId(), env.GetDispatch(), env.GetSignature()); {
	case errors.Is(err, peer.ErrUnknownKey):
		s.cfg.Logger.Warn("execute refused: signed by a key this worker does not trust", "key_id", env.GetKeyId())
		return nil, status.Error(codes.Unauthenticated, "execute: the dispatch is signed by a key this worker does not trust")
	case err != nil:
		s.cfg.Logger.Warn("execute refused: the dispatch signature does not verify", "key_id", env.GetKeyId())
		return nil, status.Error(codes.PermissionDenied, "execute: the dispatch signature does not verify")
	}
	var d fanoutv1.Dispatch
	if err := proto.Unmarshal(env.GetDispatch(), &d); err != nil {
		return nil, badRequest(violation("dispatch", "is not a fanout.v1.Dispatch: "+err.Error()))
	}
	return &d, nil
}

// dispatchKey names one dispatch of a task.
func dispatchKey(req *fanoutv1.Dispatch) string {
	return fmt.Sprintf("%s/%s/a%d", req.GetRunId(), req.GetTask().GetId(), req.GetAttempt())
}

func (s *Server) acquire(req *fanoutv1.Dispatch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		// Draining: the orchestrator sends the task to another worker at
		// once (or, with none, waits for one); nothing was reserved.
		return refusal(codes.Unavailable, "WORKER_DRAINING", s.cfg.Name,
			fmt.Sprintf("worker %s is draining (shutting down); send the task elsewhere", s.cfg.Name))
	}
	if s.inFlight[dispatchKey(req)] {
		// A replayed envelope: the same attempt's reserve keys would hand
		// it the running subagent's grants.
		return status.Errorf(codes.AlreadyExists, "attempt %d of task %s of run %s is already running here",
			req.GetAttempt(), req.GetTask().GetId(), req.GetRunId())
	}
	if s.running >= s.cfg.Capacity {
		return refusal(codes.ResourceExhausted, "WORKER_FULL", s.cfg.Name,
			fmt.Sprintf("worker %s is full (%d subagents running)", s.cfg.Name, s.running))
	}
	s.running++
	s.inFlight[dispatchKey(req)] = true
	s.wg.Add(1)
	metrics().capacityUsed.Add(context.Background(), 1)
	return nil
}

// refusal is the status of a call the worker refuses before it reserved
// anything, with an ErrorInfo (domain fanout) naming reason and worker.
func refusal(code codes.Code, reason, worker, msg string) error {
	st, err := status.New(code, msg).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: "fanout",
		Metadata: map[string]string{"worker": worker}})
	if err != nil {
		return status.Error(code, msg)
	}
	return st.Err()
}

func (s *Server) release(req *fanoutv1.Dispatch) {
	s.mu.Lock()
	s.running--
	delete(s.inFlight, dispatchKey(req))
	s.mu.Unlock()
	metrics().capacityUsed.Add(context.Background(), -1)
	s.wg.Done()
}

// park gives a running subagent's slot back while it waits for its child
// run (fan_out), and returns what takes it again: a worker full of
// parents waiting for their children would otherwise never run the
// children. Taken again, the slot may put the worker over its capacity
// for a moment (the child's tasks hold theirs until they end); new
// dispatches are refused until it is under again.
func (s *Server) park() (unpark func()) {
	s.mu.Lock()
	s.running--
	s.mu.Unlock()
	metrics().capacityUsed.Add(context.Background(), -1)
	return func() {
		s.mu.Lock()
		s.running++
		s.mu.Unlock()
		metrics().capacityUsed.Add(context.Background(), 1)
	}
}

// Shutdown stops accepting subagents (new calls get UNAVAILABLE) and waits
// for the running ones to end. When ctx ends first it cancels them with
// cause ErrShuttingDown — each settles or voids its reservation on the way
// out — waits for them, and returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.unlisted.Do(func() { metrics().capacityLimit.Add(context.Background(), -int64(s.cfg.Capacity)) })
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.stopFunc(ErrShuttingDown)
		<-done
		return ctx.Err()
	}
}

// validate checks req before anything is spent.
func (s *Server) validate(req *fanoutv1.Dispatch) error {
	var v []*errdetails.BadRequest_FieldViolation
	add := func(field, desc string) { v = append(v, violation(field, desc)) }
	if req.GetRunId() == "" {
		add("run_id", "required")
	}
	if req.GetTenantId() == "" {
		add("tenant_id", "required")
	}
	if req.GetTaskAccountId() <= 0 {
		add("task_account_id", "must be > 0")
	}
	if req.GetMinReservationTokens() < 0 {
		add("min_reservation_tokens", "must be >= 0")
	}
	if req.GetAttempt() < 1 {
		add("attempt", "must be >= 1 (the attempt the ledger recorded for this dispatch)")
	}
	if req.GetAttemptSecret() == "" {
		add("attempt_secret", "must be set (the secret the ledger made for this attempt, which a worker's login presents)")
	} else if n := len(req.GetAttemptSecret()); n > 256 {
		add("attempt_secret", fmt.Sprintf("must be at most 256 bytes, got %d", n))
	}
	if n := req.GetModel().GetMaxOutputTokens(); n < 0 || int(n) > s.cfg.MaxOutputTokensCap {
		add("model.max_output_tokens", fmt.Sprintf("must be in 0..%d", s.cfg.MaxOutputTokensCap))
	}
	switch p := req.GetOnExhaustion(); p {
	case fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_UNSPECIFIED,
		fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_CANCEL,
		fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_DRAIN:
	default:
		add("on_exhaustion", fmt.Sprintf("unknown policy %d", p))
	}
	s.validateTask(req.GetTask(), add)
	if len(v) > 0 {
		return badRequest(v...)
	}
	return nil
}

// validateTask checks a dispatch's task, reporting each violation to add.
func (s *Server) validateTask(t *fanoutv1.TaskSpec, add func(field, desc string)) {
	if t == nil {
		add("task", "required")
		return
	}
	if t.GetId() == "" {
		add("task.id", "required")
	}
	if t.GetInstruction() == "" {
		add("task.instruction", "required")
	}
	if n := t.GetMaxIterations(); n < 0 || int(n) > s.cfg.MaxIterCap {
		add("task.max_iterations", fmt.Sprintf("must be in 0..%d", s.cfg.MaxIterCap))
	}
	for i, name := range t.GetAllowedTools() {
		if !s.tools().Known(name) {
			add(fmt.Sprintf("task.allowed_tools[%d]", i), fmt.Sprintf("unknown tool %q", name))
		}
	}
	if d := t.GetTimeout(); d != nil && (d.CheckValid() != nil || d.AsDuration() <= 0) {
		add("task.timeout", "must be a positive duration")
	}
}

// tools is the registry a task starting now gets.
func (s *Server) tools() *Tools {
	if s.cfg.ToolsFunc != nil {
		return s.cfg.ToolsFunc()
	}
	return s.cfg.Tools
}

func violation(field, desc string) *errdetails.BadRequest_FieldViolation {
	return &errdetails.BadRequest_FieldViolation{Field: field, Description: desc}
}

func badRequest(v ...*errdetails.BadRequest_FieldViolation) error {
	msg := "invalid request: " + v[0].GetField() + ": " + v[0].GetDescription()
	st, err := status.New(codes.InvalidArgument, msg).WithDetails(&errdetails.BadRequest{FieldViolations: v})
	if err != nil {
		return status.Error(codes.InvalidArgument, msg)
	}
	return st.Err()
}

func taskFromRequest(req *fanoutv1.Dispatch) *Task {
	t := req.GetTask()
	facts := make([]Fact, len(req.GetContextFacts()))
	for i, f := range req.GetContextFacts() {
		facts[i] = Fact{Text: f.GetText(), Sources: f.GetSources()}
	}
	policy := PolicyCancel
	if req.GetOnExhaustion() == fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_DRAIN {
		policy = PolicyDrain
	}
	return &Task{
		RunID:          req.GetRunId(),
		TenantID:       req.GetTenantId(),
		TaskID:         t.GetId(),
		Goal:           req.GetGoal(),
		Instruction:    t.GetInstruction(),
		ContextFacts:   facts,
		Account:        budget.AccountID(req.GetTaskAccountId()),
		MinReservation: req.GetMinReservationTokens(),
		MaxIterations:  int(t.GetMaxIterations()),
		AllowedTools:   t.GetAllowedTools(),
		Attempt:        int(req.GetAttempt()),
		AttemptSecret:  req.GetAttemptSecret(),
		FromHeld:       req.GetDrawOnHeld(),
		WindDownAfter:  int(req.GetWindDownAfter()),
		CacheTools:     req.GetCacheTools(),
		OnExhaustion:   policy,
		ModelName:      req.GetModel().GetModel(),
		Temperature:    req.GetModel().GetTemperature(),
		Seed:           req.GetModel().GetSeed(),
		// 0: the worker's --max-output-tokens (Loop.MaxOutputTokens).
		MaxOutputTokens: int(req.GetModel().GetMaxOutputTokens()),
	}
}

// Proto returns the summary as the FactSummary the worker streams.
func (sum Summary) Proto() *fanoutv1.FactSummary {
	facts := make([]*fanoutv1.Fact, len(sum.Facts))
	for i, f := range sum.Facts {
		facts[i] = &fanoutv1.Fact{Text: f.Text, Sources: f.Sources}
	}
	out := &fanoutv1.FactSummary{
		Facts:       facts,
		Tried:       sum.Tried,
		Failed:      sum.Failed,
		TokensSpent: sum.TokensSpent,
		Iterations:  int32(sum.Iterations),
		Status:      sum.Status.Proto(),
		WoundDown:   sum.WoundDown,
		PeakTokens:  sum.Peak,
	}
	if sum.Status != StatusSucceeded && sum.Err != nil {
		out.Error = sum.Err.Error()
	}
	return out
}

// Proto returns the fanout.v1.TaskStatus for st.
func (st Status) Proto() fanoutv1.TaskStatus {
	if v, err := runs.ParseStatus(string(st)); err == nil {
		return v
	}
	return fanoutv1.TaskStatus_TASK_STATUS_FAILED
}

// cancelOnly is the run watch of a dispatch that draws on what its run
// holds back for its synthesis: the run's exhaustion does not end it (the
// allowance is outside what the run's subagents are exhausted at); the
// run's cancel or close does, as for any call.
type cancelOnly struct{ RunWatch }

// Done implements RunWatch: closed when the run is cancelled or closed.
func (c cancelOnly) Done() <-chan struct{} { return c.Cancelled() }

// Signal implements RunWatch: the cancel or close.
func (c cancelOnly) Signal() budget.RunSignal { return c.CancelSignal() }
