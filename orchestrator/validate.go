package orchestrator

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// Limits of a RunSpec that are part of the API contract (proto comments).
const (
	maxIdempotencyKeyBytes = 128
	maxTaskIDBytes         = 64
	maxTenantIDBytes       = 128
	maxLabelKeyBytes       = 63
	maxLabelValueBytes     = 255
	maxLabels              = 64
	maxCancelReasonBytes   = 1024
)

// validator collects everything wrong with a request, as the budget
// package's one validation error type.
type validator struct {
	bad  budget.ValidationErrors // malformed
	caps budget.ValidationErrors // well-formed but over a server cap
}

func (v *validator) add(field, format string, args ...any) {
	v.bad = append(v.bad, &budget.ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)})
}

func (v *validator) overCap(field, format string, args ...any) {
	v.caps = append(v.caps, &budget.ValidationError{Field: field, Reason: fmt.Sprintf(format, args...), OverCap: true})
}

// reason checks a request's free-text reason (CancelRun, ContinueRun):
// at most maxCancelReasonBytes.
func (v *validator) reason(s string) {
	if n := len(s); n > maxCancelReasonBytes {
		v.add("reason", "must be at most %d bytes, got %d", maxCancelReasonBytes, n)
	}
}

func (v *validator) err() error {
	switch {
	case len(v.bad) > 0:
		return append(v.bad, v.caps...)
	case len(v.caps) > 0:
		return v.caps
	}
	return nil
}

// textProblem reports what keeps s from being stored as PostgreSQL text
// (which refuses NUL and invalid UTF-8) and logged as it is, or "".
// protobuf-go refuses invalid UTF-8 in proto3 strings on the wire, but not
// NUL, and not in messages built in process.
func textProblem(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "must be valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "must not contain NUL bytes"
	}
	return ""
}

// text adds a violation for every string in m, at any depth, that
// textProblem refuses; path is m's field path. It walks the message rather
// than listing fields so that a string field added to the API is covered
// without being named here. Length limits are checked where each field is.
func (v *validator) text(path string, m protoreflect.Message) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() { // declaration order, so violations are stable
		fd := fields.Get(i)
		if !m.Has(fd) {
			continue
		}
		field := string(fd.Name())
		if path != "" {
			field = path + "." + field
		}
		val := m.Get(fd)
		switch {
		case fd.IsMap():
			var keys []protoreflect.MapKey
			val.Map().Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
				keys = append(keys, k)
				return true
			})
			slices.SortFunc(keys, func(a, b protoreflect.MapKey) int { return strings.Compare(a.String(), b.String()) })
			for _, k := range keys {
				entry := fmt.Sprintf("%s[%s]", field, k.String())
				if fd.MapKey().Kind() == protoreflect.StringKind {
					entry = fmt.Sprintf("%s[%q]", field, k.String()) // as spec.labels["k"] elsewhere
				}
				v.textValue(entry, fd.MapKey(), k.Value(), "key ")
				v.textValue(entry, fd.MapValue(), val.Map().Get(k), "value ")
			}
		case fd.IsList():
			for j := range val.List().Len() {
				v.textValue(fmt.Sprintf("%s[%d]", field, j), fd, val.List().Get(j), "")
			}
		default:
			v.textValue(field, fd, val, "")
		}
	}
}

// textValue checks one value of fd: a string itself, a message by walking
// it. what starts the description ("key " or "value " in a map entry).
func (v *validator) textValue(field string, fd protoreflect.FieldDescriptor, val protoreflect.Value, what string) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if msg := textProblem(val.String()); msg != "" {
			v.add(field, "%s%s", what, msg)
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		v.text(field, val.Message())
	}
}

// plan is a validated spec with the server's defaults applied.
type plan struct {
	spec           *fanoutv1.RunSpec
	tenantID       string
	minReservation int64
	synthesisHeld  int64 // tokens held back for the synthesis from the start (0 without synthesize)
	concurrency    int
	runTimeout     time.Duration
	taskTimeouts   []time.Duration
	iterations     []int32
	deps           [][]int // deps[i]: dispatch indexes task i depends on, in dispatch order

	// autoConcurrency: the spec left max_concurrency unset, so the engine
	// sizes it from the rate limits when it reads them (concurrency.go);
	// firstSizing is Submit's choice, headroom the tenant's.
	autoConcurrency bool
	firstSizing     *concurrencyInputs
	headroom        float64

	// Of the tenant (Engine.checkTenant), not of the spec:
	tenantAccount    budget.AccountID // its ledger account, 0 if it has no budget
	tenantAvailable  int64            // what that account had available at admission (0: no budget)
	tenantExhausted  bool             // that was below its min_reservation (a quote covers nothing)
	maxTasksInFlight int              // its cap on tasks in flight, 0 if none
	prior            prior            // what its tasks cost with the run's model in earlier runs

	// tree: where the run stands in its tree of child runs (fanout.go).
	tree tree

	// spentBeside: what a continued run spent beside its tasks before it
	// reopened (its earlier syntheses): the forecast counts it spent.
	spentBeside int64
}

// Validate checks spec against the API contract and cfg's caps and returns
// a budget.ValidationErrors naming every offending field (paths start with
// "spec."), or nil.
func (c Config) Validate(spec *fanoutv1.RunSpec) error {
	_, err := c.withDefaults().callerPlan(spec)
	return err
}

// callerPlan is plan for a spec a caller sent (StartRun, its dry run,
// ForkRun): its idempotency key may not be one the engine keeps for child
// runs, which it plans with plan.
func (c Config) callerPlan(spec *fanoutv1.RunSpec) (*plan, error) {
	if strings.HasPrefix(spec.GetIdempotencyKey(), childKeyPrefix) {
		return nil, budget.ValidationErrors{&budget.ValidationError{Field: "spec.idempotency_key",
			Reason: fmt.Sprintf("must not start with %q: it is kept for child runs (docs/budget.md#nested-fan-out)", childKeyPrefix)}}
	}
	return c.plan(spec)
}

// plan validates spec completely, before anything is written, and returns
// the run's plan: every default applied and every cap enforced. c must have
// its defaults applied.
func (c Config) plan(spec *fanoutv1.RunSpec) (*plan, error) {
	var v validator
	if spec == nil {
		v.add("spec", "is required")
		return nil, v.err()
	}
	if size := proto.Size(spec); size > c.MaxSpecBytes {
		v.overCap("spec", "is %d bytes encoded, the limit is %d", size, c.MaxSpecBytes)
		return nil, v.err()
	}
	// Every string, whatever field holds it: the store writes them as text
	// and the logs print them.
	v.text("spec", spec.ProtoReflect())
	p := &plan{spec: spec, tenantID: spec.GetTenantId()}
	if p.tenantID == "" {
		p.tenantID = "default"
	}
	if n := len(spec.GetTenantId()); n > maxTenantIDBytes {
		v.add("spec.tenant_id", "must be at most %d bytes, got %d", maxTenantIDBytes, n)
	}
	switch n := len(spec.GetIdempotencyKey()); {
	case n == 0:
		v.add("spec.idempotency_key", "is required (1 to %d bytes)", maxIdempotencyKeyBytes)
	case n > maxIdempotencyKeyBytes:
		v.add("spec.idempotency_key", "must be at most %d bytes, got %d", maxIdempotencyKeyBytes, n)
	}
	c.planBudget(&v, p)
	c.planLimits(&v, p)
	c.checkModel(&v, spec.GetModel())
	checkLabels(&v, spec.GetLabels())
	checkCache(&v, spec.GetCache())
	checkFanOut(&v, spec)
	if !c.planTasks(&v, p) {
		return nil, v.err() // do not walk an oversized plan
	}
	if len(v.bad) == 0 {
		if cycle := findCycle(spec.GetTasks(), p.deps); cycle != "" {
			v.add("spec.tasks", "dependency cycle %s", cycle)
		}
		c.planSynthesis(&v, p)
	}
	if err := v.err(); err != nil {
		return nil, err
	}
	return p, nil
}

// planBudget checks spec.budget and sets the run's minimum reservation.
func (c Config) planBudget(v *validator, p *plan) {
	spec := p.spec
	limit := spec.GetBudget().GetLimitTokens()
	switch {
	case limit <= 0:
		v.add("spec.budget.limit_tokens", "must be > 0, got %d", limit)
	case c.MaxRunTokens > 0 && limit > c.MaxRunTokens:
		v.overCap("spec.budget.limit_tokens", "must be at most %d, got %d", c.MaxRunTokens, limit)
	}
	p.minReservation = spec.GetBudget().GetMinReservationTokens()
	switch {
	case p.minReservation < 0:
		v.add("spec.budget.min_reservation_tokens", "must be >= 0, got %d", p.minReservation)
	case p.minReservation > 0 && limit > 0 && p.minReservation > limit:
		v.add("spec.budget.min_reservation_tokens", "must not exceed limit_tokens (%d), got %d", limit, p.minReservation)
	case p.minReservation == 0:
		p.minReservation = max(1, min(c.DefaultMinReservation, limit))
	}
}

// Sizing of the synthesis allowance when the spec sets none
// (Budget.synthesis_tokens): the output cap, plus what the joined facts and
// the instruction are expected to take, at most a quarter of the budget.
const (
	defaultSynthesisOutput  = 1024 // the worker's default max_output_tokens
	synthesisTokensPerTask  = 256
	synthesisInstructionTok = 512
)

// planSynthesis sets what the run holds back for its synthesis (I19): the
// spec's budget.synthesis_tokens, or a size from the output cap and the
// tasks, never more than limit - min_reservation.
func (c Config) planSynthesis(v *validator, p *plan) {
	spec := p.spec
	limit := spec.GetBudget().GetLimitTokens()
	held := spec.GetBudget().GetSynthesisTokens()
	room := limit - p.minReservation
	switch {
	case held < 0:
		v.add("spec.budget.synthesis_tokens", "must be >= 0, got %d", held)
	case held > 0 && !spec.GetSynthesize():
		v.add("spec.budget.synthesis_tokens", "is for a run with synthesize set, got %d without it", held)
	case held > room:
		v.add("spec.budget.synthesis_tokens", "must be at most limit_tokens - min_reservation_tokens (%d), got %d", room, held)
	case held > 0:
		p.synthesisHeld = held
	case spec.GetSynthesize():
		out := int64(defaultSynthesisOutput)
		if n := spec.GetModel().GetMaxOutputTokens(); n > 0 {
			out = int64(n)
		}
		size := out + synthesisTokensPerTask*int64(len(spec.GetTasks())) + synthesisInstructionTok
		p.synthesisHeld = max(0, min(size, limit/4, room))
	}
}

// planLimits checks spec.limits and the policies, and sets the run's
// concurrency and timeout.
func (c Config) planLimits(v *validator, p *plan) {
	spec := p.spec
	conc := spec.GetLimits().GetMaxConcurrency()
	switch {
	case conc < 0:
		v.add("spec.limits.max_concurrency", "must be >= 0, got %d", conc)
	case conc == 0:
		p.concurrency = int(c.DefaultConcurrency)
		p.autoConcurrency, p.headroom = true, c.DefaultHeadroom
	default:
		p.concurrency = int(min(conc, c.MaxConcurrency)) // the server caps it
	}
	p.runTimeout = c.DefaultRunTimeout
	if d := spec.GetLimits().GetRunTimeout(); d != nil {
		switch {
		case d.CheckValid() != nil:
			v.add("spec.limits.run_timeout", "is not a valid duration: %v", d.CheckValid())
		case d.AsDuration() <= 0:
			v.add("spec.limits.run_timeout", "must be > 0, got %s", d.AsDuration())
		default:
			p.runTimeout = min(d.AsDuration(), c.MaxRunTimeout)
		}
	}
	if _, ok := fanoutv1.ExhaustionPolicy_name[int32(spec.GetOnExhaustion())]; !ok {
		v.add("spec.on_exhaustion", "unknown policy %d", spec.GetOnExhaustion())
	}
	if _, ok := fanoutv1.AdmissionPolicy_name[int32(spec.GetBudget().GetAdmission())]; !ok {
		v.add("spec.budget.admission", "unknown policy %d", spec.GetBudget().GetAdmission())
	}
	if _, ok := fanoutv1.JoinPolicy_name[int32(spec.GetJoinPolicy())]; !ok {
		v.add("spec.join_policy", "unknown policy %d", spec.GetJoinPolicy())
	}
}

// checkModel checks spec.model.
func (c Config) checkModel(v *validator, m *fanoutv1.ModelSettings) {
	if m == nil {
		return
	}
	switch m.GetProvider() {
	case "", "sim", "openai", "anthropic":
	default:
		v.add("spec.model.provider", `must be "sim", "openai", "anthropic" or empty, got %q`, m.GetProvider())
	}
	if n := len(m.GetModel()); n > budget.MaxModelLen {
		v.add("spec.model.model", "must be at most %d bytes (the ledger's limit), got %d", budget.MaxModelLen, n)
	}
	if t := m.GetTemperature(); !(t >= 0 && t <= 2) { // also catches NaN
		v.add("spec.model.temperature", "must be in 0..2, got %v", t)
	}
	if n := m.GetMaxOutputTokens(); n < 0 || int64(n) > int64(c.MaxOutputTokens) {
		v.add("spec.model.max_output_tokens", "must be in 0..%d, got %d", c.MaxOutputTokens, n)
	}
}

// checkLabels checks spec.labels.
func checkLabels(v *validator, labels map[string]string) {
	if n := len(labels); n > maxLabels {
		v.add("spec.labels", "at most %d labels, got %d", maxLabels, n)
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		field := fmt.Sprintf("spec.labels[%q]", k)
		switch n := len(k); {
		case n == 0:
			v.add(field, "label keys must not be empty")
		case n > maxLabelKeyBytes:
			v.add(field, "label keys must be at most %d bytes, got %d", maxLabelKeyBytes, n)
		}
		if n := len(labels[k]); n > maxLabelValueBytes {
			v.add(field, "label values must be at most %d bytes, got %d", maxLabelValueBytes, n)
		}
	}
}

// planTasks checks spec.tasks and plans each task. It reports false when
// the tasks are too many to walk.
func (c Config) planTasks(v *validator, p *plan) bool {
	spec := p.spec
	tasks := spec.GetTasks()
	switch {
	case len(tasks) == 0:
		v.add("spec.tasks", "at least one task is required")
	case len(tasks) > c.MaxTasks:
		v.overCap("spec.tasks", "at most %d tasks, got %d", c.MaxTasks, len(tasks))
		return false
	}
	index := taskIndex(v, tasks)
	known := make(map[string]bool, len(c.KnownTools))
	for _, name := range c.KnownTools {
		known[name] = true
	}
	p.taskTimeouts = make([]time.Duration, len(tasks))
	p.iterations = make([]int32, len(tasks))
	p.deps = make([][]int, len(tasks))
	for i := range tasks {
		c.planTask(v, p, i, index, known)
	}
	return true
}

// tenantTools are the known tools the operator's policy lets tenant use,
// in KnownTools' order: what an unknown tool's error may list, never a tool
// the policy keeps for other tenants.
func (c Config) tenantTools(tenant string) []string {
	var tools []string
	for _, name := range c.KnownTools {
		if rule, ruled := c.ToolRules[name]; !ruled || rule.allows(tenant) {
			tools = append(tools, name)
		}
	}
	return tools
}

// taskIndex checks the tasks' ids and returns each valid one's dispatch
// index.
func taskIndex(v *validator, tasks []*fanoutv1.TaskSpec) map[string]int {
	index := make(map[string]int, len(tasks))
	for i, t := range tasks {
		field := fmt.Sprintf("spec.tasks[%d].id", i)
		switch id := t.GetId(); {
		case id == "":
			v.add(field, "is required")
		case len(id) > maxTaskIDBytes:
			v.add(field, "must be at most %d bytes, got %d", maxTaskIDBytes, len(id))
		case strings.HasPrefix(id, "_"):
			v.add(field, "must not start with \"_\" (reserved for fanout's own calls, such as %q), got %q", synthesisTaskID, id)
		default:
			if j, dup := index[id]; dup {
				v.add(field, "duplicate task id %q (also spec.tasks[%d].id)", id, j)
			} else {
				index[id] = i
			}
		}
	}
	return index
}

// planTask checks task i and plans its iterations, timeout and
// dependencies (index: the dispatch index of each task id; known: the
// tools a task may allow).
func (c Config) planTask(v *validator, p *plan, i int, index map[string]int, known map[string]bool) {
	t := p.spec.GetTasks()[i]
	field := func(name string) string { return fmt.Sprintf("spec.tasks[%d].%s", i, name) }
	if t.GetInstruction() == "" {
		v.add(field("instruction"), "is required")
	}
	if b := t.GetTokenBudget(); b <= 0 {
		v.add(field("token_budget"), "must be > 0, got %d", b)
	}
	switch n := t.GetMaxIterations(); {
	case n < 0 || n > c.MaxIterations:
		v.add(field("max_iterations"), "must be 0 (server default) or 1..%d, got %d", c.MaxIterations, n)
	case n == 0:
		p.iterations[i] = c.DefaultIterations
	default:
		p.iterations[i] = n
	}
	for j, name := range t.GetAllowedTools() {
		switch rule, ruled := c.ToolRules[name]; {
		case !known[name]:
			v.add(fmt.Sprintf("spec.tasks[%d].allowed_tools[%d]", i, j), "unknown tool %q (this tenant's tools: %s)",
				name, strings.Join(c.tenantTools(p.tenantID), ", "))
		case ruled && !rule.allows(p.tenantID):
			// The same words as for an unknown tool would hide nothing:
			// the operator's config says which tenants may use it.
			v.add(fmt.Sprintf("spec.tasks[%d].allowed_tools[%d]", i, j), "task %q may not use tool %q: "+
				"the operator's tool policy does not allow it for tenant %q", t.GetId(), name, p.tenantID)
		}
	}
	p.taskTimeouts[i] = c.DefaultTaskTimeout
	if d := t.GetTimeout(); d != nil {
		switch {
		case d.CheckValid() != nil:
			v.add(field("timeout"), "is not a valid duration: %v", d.CheckValid())
		case d.AsDuration() <= 0:
			v.add(field("timeout"), "must be > 0, got %s", d.AsDuration())
		default:
			p.taskTimeouts[i] = d.AsDuration()
		}
	}
	p.taskTimeouts[i] = min(p.taskTimeouts[i], p.runTimeout)
	seen := map[int]bool{}
	for j, dep := range t.GetDependsOn() {
		k, ok := index[dep]
		switch {
		case !ok:
			v.add(fmt.Sprintf("spec.tasks[%d].depends_on[%d]", i, j), "names no task of the run: %q", dep)
		case !seen[k]:
			seen[k] = true
			p.deps[i] = append(p.deps[i], k)
		}
	}
	slices.Sort(p.deps[i])
	c.planHedge(v, p, i)
}

// findCycle returns a dependency cycle as "a -> b -> a" (a depends on b,
// which depends on a), or "" if there is none.
func findCycle(tasks []*fanoutv1.TaskSpec, deps [][]int) string {
	const (
		unseen = iota
		onPath
		done
	)
	color := make([]int, len(tasks))
	var path []int
	var found []int
	var visit func(i int) bool
	visit = func(i int) bool {
		color[i] = onPath
		path = append(path, i)
		for _, d := range deps[i] {
			switch color[d] {
			case onPath:
				start := slices.Index(path, d)
				found = append(slices.Clone(path[start:]), d)
				return true
			case unseen:
				if visit(d) {
					return true
				}
			}
		}
		path = path[:len(path)-1]
		color[i] = done
		return false
	}
	for i := range tasks {
		if color[i] == unseen && visit(i) {
			names := make([]string, len(found))
			for k, j := range found {
				names[k] = tasks[j].GetId()
			}
			return strings.Join(names, " -> ")
		}
	}
	return ""
}

// Plan returns the batches a valid spec's tasks run in: batch 0 holds the
// tasks without dependencies, batch k those whose deepest dependency is in
// batch k-1; each batch lists dispatch indexes in dispatch order. The engine
// starts each task as soon as its own dependencies have ended, so batches
// are an upper bound on waiting, not barriers. It returns the same
// budget.ValidationErrors as Validate.
func (c Config) Plan(spec *fanoutv1.RunSpec) ([][]int, error) {
	p, err := c.withDefaults().callerPlan(spec)
	if err != nil {
		return nil, err
	}
	return p.batches(), nil
}

func (p *plan) batches() [][]int {
	level := make([]int, len(p.deps))
	var depth func(i int) int
	depth = func(i int) int {
		if level[i] > 0 {
			return level[i]
		}
		l := 1
		for _, d := range p.deps[i] {
			l = max(l, depth(d)+1)
		}
		level[i] = l
		return l
	}
	var out [][]int
	for i := range p.deps {
		l := depth(i)
		for len(out) < l {
			out = append(out, nil)
		}
		out[l-1] = append(out[l-1], i)
	}
	return out
}
