package subagent_test

import (
	"errors"
	"testing"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

func TestProviderModelsSelectsByProvider(t *testing.T) {
	t.Parallel()
	sim, _ := llm.NewSim(llm.SimConfig{})
	other, _ := llm.NewSim(llm.SimConfig{Seed: 2})
	f := subagent.ProviderModels(map[string]llm.Model{"sim": sim, "openai": other}, "sim")
	for _, tc := range []struct {
		provider string
		want     llm.Model
	}{{"", sim}, {"sim", sim}, {"openai", other}} {
		m, err := f(&fanoutv1.ModelSettings{Provider: tc.provider})
		if err != nil || m != tc.want {
			t.Errorf("provider %q: got %v, %v", tc.provider, m, err)
		}
	}
	if _, err := f(&fanoutv1.ModelSettings{Provider: "anthropic"}); !errors.Is(err, subagent.ErrUnknownProvider) {
		t.Errorf("unconfigured provider: err = %v, want ErrUnknownProvider", err)
	}
	if m, err := f(nil); err != nil || m != sim {
		t.Errorf("nil settings: got %v, %v", m, err)
	}
}
