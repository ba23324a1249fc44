package main

import (
	"context"
	"fmt"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// runPageSize is the page size of the CLI's ListRunTasks and ListRunFacts
// calls: the server's maximum (a page may hold fewer, by its byte cap).
const runPageSize = 1000

// completeRun fills in what the server cut of r to keep its response under
// its cap (Run.tasks, its result's facts and tasks), by paging ListRunTasks
// and ListRunFacts from the tokens r carries, so that what the CLI prints
// is whole. The tokens are cleared once followed.
func completeRun(ctx context.Context, client fanoutv1.OrchestratorServiceClient, r *fanoutv1.Run) error {
	if r == nil {
		return nil
	}
	var err error
	if r.Tasks, err = restOfTasks(ctx, client, r.GetRunId(), r.GetTasks(), r.GetTasksNextPageToken()); err != nil {
		return err
	}
	r.TasksNextPageToken = ""
	return completeResult(ctx, client, r.GetRunId(), r.GetResult())
}

// completeResult is completeRun for a joined result (RunFinished's).
func completeResult(ctx context.Context, client fanoutv1.OrchestratorServiceClient, runID string, res *fanoutv1.JoinedResult) error {
	if res == nil {
		return nil
	}
	var err error
	if res.Tasks, err = restOfTasks(ctx, client, runID, res.GetTasks(), res.GetTasksNextPageToken()); err != nil {
		return err
	}
	res.TasksNextPageToken = ""
	res.Facts, err = restOf(res.GetFacts(), res.GetFactsNextPageToken(), func(token string) ([]*fanoutv1.Fact, string, error) {
		page, err := client.ListRunFacts(ctx, &fanoutv1.ListRunFactsRequest{RunId: runID, PageSize: runPageSize, PageToken: token})
		return page.GetFacts(), page.GetNextPageToken(), err
	})
	res.FactsNextPageToken = ""
	return err
}

func restOfTasks(ctx context.Context, client fanoutv1.OrchestratorServiceClient, runID string, have []*fanoutv1.TaskOutcome,
	token string) ([]*fanoutv1.TaskOutcome, error) {
	return restOf(have, token, func(token string) ([]*fanoutv1.TaskOutcome, string, error) {
		page, err := client.ListRunTasks(ctx, &fanoutv1.ListRunTasksRequest{RunId: runID, PageSize: runPageSize, PageToken: token})
		return page.GetTasks(), page.GetNextPageToken(), err
	})
}

// restOf appends to have the items of the pages list returns, from token
// on, until a page has no next token.
func restOf[T any](have []T, token string, list func(token string) ([]T, string, error)) ([]T, error) {
	for token != "" {
		page, next, err := list(token)
		if err != nil {
			return have, err
		}
		if len(page) == 0 && next != "" {
			return have, fmt.Errorf("the server returned an empty page with a next page token")
		}
		have, token = append(have, page...), next
	}
	return have, nil
}
