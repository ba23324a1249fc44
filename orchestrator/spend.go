package orchestrator

import (
	"context"
	"errors"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// SpendReader reads a tenant's spend in money (store.Spending).
type SpendReader interface {
	// Report returns tenantID's spend per UTC day from fromDay to toDay
	// (YYYY-MM-DD; "" takes the defaults), and that of runIDs; a range it
	// refuses is a *runs.SpendRangeError.
	Report(ctx context.Context, tenantID, fromDay, toDay string, runIDs []string) (runs.SpendReport, error)
}

// The bounds of GetSpend (store.MaxSpendDays, store.MaxSpendRuns).
const (
	maxSpendDays = 366
	maxSpendRuns = 200
	dayLayout    = "2006-01-02"
)

// GetSpend implements fanoutv1.OrchestratorServiceServer.
func (s *Server) GetSpend(ctx context.Context, req *fanoutv1.GetSpendRequest) (*fanoutv1.GetSpendResponse, error) {
	var v validator
	v.text("", req.ProtoReflect())
	if n := len(req.GetTenantId()); n > maxTenantIDBytes {
		v.add("tenant_id", "must be at most %d bytes, got %d", maxTenantIDBytes, n)
	}
	var from, to time.Time
	for _, f := range []struct {
		name, value string
		at          *time.Time
	}{{"from_day", req.GetFromDay(), &from}, {"to_day", req.GetToDay(), &to}} {
		if f.value == "" {
			continue
		}
		t, err := time.Parse(dayLayout, f.value)
		if err != nil || t.Year() < 1 {
			v.add(f.name, "must be a day as YYYY-MM-DD from 0001-01-01 on, got %q", f.value)
			continue
		}
		*f.at = t
	}
	if !from.IsZero() && !to.IsZero() {
		switch days := int(to.Sub(from).Hours()/24) + 1; {
		case days < 1:
			v.add("from_day", "must not be after to_day %s", req.GetToDay())
		case days > maxSpendDays:
			v.add("from_day", "the range is %d days; at most %d", days, maxSpendDays)
		}
	}
	if n := len(req.GetRunIds()); n > maxSpendRuns {
		v.add("run_ids", "at most %d runs, got %d", maxSpendRuns, n)
	}
	for i, id := range req.GetRunIds() {
		if id == "" || len(id) > 128 {
			v.add("run_ids", "run_ids[%d] must be 1 to 128 bytes, got %d", i, len(id))
			break
		}
	}
	if err := v.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	tenantID, err := callerTenant(ctx, "tenant_id", req.GetTenantId())
	if err != nil {
		return nil, err
	}
	rep, err := s.e.Spend(ctx, tenantID, req.GetFromDay(), req.GetToDay(), req.GetRunIds())
	if re, ok := errors.AsType[*runs.SpendRangeError](err); ok {
		// The range as the database resolved it (a default day of its clock).
		return nil, s.toStatus(ctx, badField(re.Field, re.Why))
	} else if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &fanoutv1.GetSpendResponse{FromDay: rep.FromDay, ToDay: rep.ToDay}
	for _, d := range rep.Days {
		resp.Days = append(resp.Days, &fanoutv1.DaySpend{Day: d.Day, Runs: d.Runs, Spend: spendProto(d.Spend)})
	}
	for _, r := range rep.Runs {
		resp.Runs = append(resp.Runs, &fanoutv1.RunSpend{RunId: r.RunID, Spend: spendProto(r.Spend)})
	}
	return resp, nil
}

func spendProto(s runs.Spend) *fanoutv1.Spend {
	return &fanoutv1.Spend{Currency: s.Currency, Cost: s.Cost, ReportedCost: s.ReportedCost, WorstCaseCost: s.WorstCaseCost,
		PricedTokens: s.PricedTokens, WorstCaseTokens: s.WorstCaseTokens, UnpricedTokens: s.UnpricedTokens}
}
