package orchestrator

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// What the API serves of a run is cut to a size that does not grow with
// the run (orchestrator.proto, "Sizes"): a run's tasks, its result's facts
// and tasks, and its spec each get a share of the response; a list page
// ends before it would pass the cap.
const (
	// MaxResponseBytes bounds every response of the API and every message
	// of its streams, encoded: half of gRPC's default 4 MiB receive limit,
	// so that a client with default settings reads any of them, with room
	// for a message's envelope and trailers.
	MaxResponseBytes = 2 << 20
	// shareBytes bounds each list a run or a result carries (Run.tasks,
	// JoinedResult.facts, JoinedResult.tasks) and the spec, encoded: four of
	// them are 1.5 MiB, which leaves the rest of MaxResponseBytes to the
	// run's other fields (labels, cause, synthesis).
	shareBytes = 384 << 10
	// tokenRoom is kept in a response for what follows its items (page
	// tokens, counts): a token is at most a few hundred bytes.
	tokenRoom = 1 << 10
	// pageItemBytes bounds the items of a list page.
	pageItemBytes = MaxResponseBytes - tokenRoom

	// defaultRunPage and maxRunPage bound a ListRunTasks or ListRunFacts
	// page (a page_size above the maximum is lowered to it).
	defaultRunPage = 100
	maxRunPage     = 1000
)

// elemBytes is what m adds to a message as one element of a repeated
// field numbered below 16: a one-byte tag, its length and itself.
func elemBytes(m proto.Message) int {
	n := proto.Size(m)
	return 1 + protowire.SizeVarint(uint64(n)) + n //nolint:gosec // a size is not negative
}

// fitting returns how many of items, from the first, fit in most bytes as
// elements of a repeated field (elemBytes).
func fitting[T proto.Message](items []T, most int) int {
	used := 0
	for i, m := range items {
		if used += elemBytes(m); used > most {
			return i
		}
	}
	return len(items)
}

// pageOf returns how many of items, from the first, a list page holds:
// those that fit in pageItemBytes, and the first one always, so that a
// listing moves on.
func pageOf[T proto.Message](items []T) int {
	return max(min(1, len(items)), fitting(items, pageItemBytes))
}

// runPage is what the opaque page token of ListRunTasks and ListRunFacts
// holds: the listing's RPC, tenant and run, and the index of its next item.
type runPage struct {
	RPC    string `json:"p"` // a token of one listing is refused by the other
	Tenant string `json:"t"`
	RunID  string `json:"r"`
	Next   int    `json:"n"`
}

func (t runPage) encode() string {
	raw, _ := json.Marshal(t) //nolint:errchkjson // strings and an int: cannot fail
	return base64.RawURLEncoding.EncodeToString(raw)
}

const (
	rpcListRunTasks = "ListRunTasks"
	rpcListRunFacts = "ListRunFacts"
)

// cutRun cuts a run the API serves to its shares, in place: its spec, its
// tasks and its result, setting their counts and, where cut, the page
// tokens (for tenantID) of the rest. A run whose share of what MaxResponseBytes
// leaves is smaller than shareBytes (a long synthesis) gets less.
func cutRun(r *fanoutv1.Run, tenantID string) {
	if r == nil {
		return
	}
	cutSpec(r)
	tasks, res := r.Tasks, r.Result
	resFacts, resTasks := res.GetFacts(), res.GetTasks()
	if res != nil {
		res.Facts, res.Tasks = nil, nil
	}
	r.Tasks = nil
	left := MaxResponseBytes - tokenRoom - proto.Size(r)
	r.TaskCount = int32(len(tasks)) //nolint:gosec // at most the server's task cap
	r.Tasks, r.TasksNextPageToken = cutList(tasks, &left, rpcListRunTasks, tenantID, r.GetRunId())
	if res != nil {
		fillResult(res, resFacts, resTasks, &left, tenantID, r.GetRunId())
	}
}

// cutResult cuts a joined result the API serves (RunFinished's) to its
// shares, in place, as cutRun does a run's.
func cutResult(res *fanoutv1.JoinedResult, tenantID, runID string) {
	if res == nil {
		return
	}
	facts, tasks := res.Facts, res.Tasks
	res.Facts, res.Tasks = nil, nil
	left := MaxResponseBytes - tokenRoom - proto.Size(res)
	fillResult(res, facts, tasks, &left, tenantID, runID)
}

// fillResult sets res's facts and tasks to the first of facts and tasks
// that fit in their shares and in left, with their counts and tokens.
func fillResult(res *fanoutv1.JoinedResult, facts []*fanoutv1.Fact, tasks []*fanoutv1.TaskOutcome, left *int,
	tenantID, runID string) {
	res.FactCount = int32(len(facts)) //nolint:gosec // at most a summary's facts per task
	res.TaskCount = int32(len(tasks)) //nolint:gosec // at most the server's task cap
	res.Facts, res.FactsNextPageToken = cutList(facts, left, rpcListRunFacts, tenantID, runID)
	res.Tasks, res.TasksNextPageToken = cutList(tasks, left, rpcListRunTasks, tenantID, runID)
}

// cutList returns the first of items that fit in shareBytes and in left
// (which it lowers by what they take), and the token of rpc's page after
// them when it cut.
func cutList[T proto.Message](items []T, left *int, rpc, tenantID, runID string) ([]T, string) {
	n := fitting(items, max(0, min(shareBytes, *left)))
	for _, m := range items[:n] {
		*left -= elemBytes(m)
	}
	if n == len(items) {
		return items, ""
	}
	return items[:n], runPage{RPC: rpc, Tenant: tenantID, RunID: runID, Next: n}.encode()
}

// cutSpec cuts a served run's spec to shareBytes: whole when it fits, else
// with its tasks cut to the first that fit, else (its other fields alone
// pass the share) left out; spec_cut says so.
func cutSpec(r *fanoutv1.Run) {
	spec := r.GetSpec()
	if spec == nil || proto.Size(spec) <= shareBytes {
		return
	}
	r.SpecCut = true
	tasks := spec.Tasks
	spec.Tasks = nil
	rest := proto.Size(spec)
	if rest > shareBytes {
		r.Spec = nil
		return
	}
	spec.Tasks = tasks[:fitting(tasks, shareBytes-rest)]
}

// servedEvent returns ev as a stream sends it: a RunStarted's run and a
// RunFinished's result cut (cutRun, cutResult) on a copy, for tenantID;
// any other event as it is. Events are shared by the streams of a run: ev
// is never changed.
func servedEvent(ev *fanoutv1.RunEvent, tenantID string) *fanoutv1.RunEvent {
	if ev.GetRunStarted() == nil && ev.GetRunFinished() == nil {
		return ev
	}
	ev = proto.CloneOf(ev)
	cutRun(ev.GetRunStarted().GetRun(), tenantID)
	cutResult(ev.GetRunFinished().GetResult(), tenantID, ev.GetRunId())
	return ev
}

// runListing checks a listing by rpc of a run's items (ListRunTasks,
// ListRunFacts): every string of req, the run id, the size, the caller's
// tenant and a token that is rpc's for that tenant and run. It returns the
// tenant, the page size and the index of the page's first item; its errors
// are the statuses to answer.
func (s *Server) runListing(ctx context.Context, rpc string, req textMessage, runID string, asked int32,
	token string) (tenantID string, size, from int, err error) {
	var v validator
	v.text("", req.ProtoReflect())
	requireRunID(&v, runID)
	size = pageSize(&v, asked, defaultRunPage, maxRunPage)
	if err := v.err(); err != nil {
		return "", 0, 0, s.toStatus(ctx, err)
	}
	if tenantID, err = callerTenant(ctx, "", ""); err != nil {
		return "", 0, 0, err
	}
	if token != "" {
		var tok runPage
		raw, err := base64.RawURLEncoding.DecodeString(token)
		if err == nil {
			err = json.Unmarshal(raw, &tok)
		}
		switch {
		case err != nil || tok.RPC != rpc || tok.Next < 0 || tok.Next > math.MaxInt32 || textProblem(tok.Tenant+tok.RunID) != "":
			v.add("page_token", "is not a token from %s", rpc)
		case tok.Tenant != tenantID || tok.RunID != runID:
			v.add("page_token", "was issued for another tenant or run_id")
		}
		from = tok.Next
	}
	if err := v.err(); err != nil {
		return "", 0, 0, s.toStatus(ctx, err)
	}
	return tenantID, size, from, nil
}

// listPage returns the page of found, the items of a listing from index
// from (at most a page size of them, of total), that the response holds
// (pageOf), and the token of the page after it.
func listPage[T proto.Message](found []T, from, total int, rpc, tenantID, runID string) ([]T, string) {
	page := found[:pageOf(found)]
	if next := from + len(page); next < total {
		return page, runPage{RPC: rpc, Tenant: tenantID, RunID: runID, Next: next}.encode()
	}
	return page, ""
}

// ListRunTasks implements fanoutv1.OrchestratorServiceServer.
func (s *Server) ListRunTasks(ctx context.Context, req *fanoutv1.ListRunTasksRequest) (*fanoutv1.ListRunTasksResponse, error) {
	tenantID, size, from, err := s.runListing(ctx, rpcListRunTasks, req, req.GetRunId(), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	found, total, err := s.e.Tasks(ctx, tenantID, req.GetRunId(), from, size)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &fanoutv1.ListRunTasksResponse{TaskCount: int32(total)} //nolint:gosec // the server's task cap
	resp.Tasks, resp.NextPageToken = listPage(found, from, total, rpcListRunTasks, tenantID, req.GetRunId())
	return resp, nil
}

// ListRunFacts implements fanoutv1.OrchestratorServiceServer.
func (s *Server) ListRunFacts(ctx context.Context, req *fanoutv1.ListRunFactsRequest) (*fanoutv1.ListRunFactsResponse, error) {
	tenantID, size, from, err := s.runListing(ctx, rpcListRunFacts, req, req.GetRunId(), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	found, total, err := s.e.Facts(ctx, tenantID, req.GetRunId(), from, size)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &fanoutv1.ListRunFactsResponse{FactCount: int32(total)} //nolint:gosec // bounded by the tasks' summaries
	resp.Facts, resp.NextPageToken = listPage(found, from, total, rpcListRunFacts, tenantID, req.GetRunId())
	return resp, nil
}
