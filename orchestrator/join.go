package orchestrator

import (
	"slices"
	"strings"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// factKey normalizes a fact's text for deduplication: case, runs of white
// space and a trailing full stop do not make two facts different.
func factKey(text string) string {
	return strings.TrimSuffix(strings.ToLower(strings.Join(strings.Fields(text), " ")), ".")
}

// mergeFacts appends facts to out in order, merging each one whose
// normalized text is already there into that fact (keeping the first text
// and adding new sources in order). index maps keys to positions in out.
func mergeFacts(out []*fanoutv1.Fact, index map[string]int, facts []*fanoutv1.Fact) []*fanoutv1.Fact {
	for _, f := range facts {
		key := factKey(f.GetText())
		if key == "" {
			continue
		}
		i, ok := index[key]
		if !ok {
			index[key] = len(out)
			out = append(out, &fanoutv1.Fact{Text: f.GetText()})
			i = len(out) - 1
		}
		for _, src := range f.GetSources() {
			if !slices.Contains(out[i].Sources, src) {
				out[i].Sources = append(out[i].Sources, src)
			}
		}
	}
	return out
}

// join builds a run's result from every task's outcome in dispatch order:
// facts in dispatch order with duplicates merged, every outcome (failures
// too), and the tokens spent.
func join(outcomes []*fanoutv1.TaskOutcome) *fanoutv1.JoinedResult {
	res := &fanoutv1.JoinedResult{Tasks: outcomes}
	index := map[string]int{}
	for _, o := range outcomes {
		res.Facts = mergeFacts(res.Facts, index, o.GetSummary().GetFacts())
		res.TotalTokens += o.GetTokensSpent()
	}
	return res
}
