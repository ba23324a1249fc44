package fleet

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is one scrape of a node's /metrics.
type Metrics map[string]*dto.MetricFamily

// Scrape reads url (a node's /metrics) within 10 s.
func Scrape(ctx context.Context, url string) (Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	m, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	return m, nil
}

// Value is the sum of the gauges or counters named name whose labels
// include match; ok is false if there is none.
func (m Metrics) Value(name string, match map[string]string) (v float64, ok bool) {
	f := m[name]
	if f == nil {
		return 0, false
	}
	for _, s := range f.GetMetric() {
		if !labelsMatch(s, match) {
			continue
		}
		switch {
		case s.GetGauge() != nil:
			v, ok = v+s.GetGauge().GetValue(), true
		case s.GetCounter() != nil:
			v, ok = v+s.GetCounter().GetValue(), true
		case s.GetUntyped() != nil:
			v, ok = v+s.GetUntyped().GetValue(), true
		}
	}
	return v, ok
}

func labelsMatch(s *dto.Metric, match map[string]string) bool {
	n := 0
	for _, l := range s.GetLabel() {
		if want, ok := match[l.GetName()]; ok {
			if l.GetValue() != want {
				return false
			}
			n++
		}
	}
	return n == len(match)
}

// Histogram is the buckets of a histogram: cumulative counts by upper
// bound, ascending, the last +Inf.
type Histogram struct {
	Bounds []float64
	Counts []float64
	Sum    float64
}

// Histogram adds up the histograms named name whose labels include match
// (over several nodes too: Add).
func (m Metrics) Histogram(name string, match map[string]string) Histogram {
	var h Histogram
	f := m[name]
	if f == nil {
		return h
	}
	for _, s := range f.GetMetric() {
		if !labelsMatch(s, match) || s.GetHistogram() == nil {
			continue
		}
		var one Histogram
		for _, b := range s.GetHistogram().GetBucket() {
			one.Bounds = append(one.Bounds, b.GetUpperBound())
			one.Counts = append(one.Counts, float64(b.GetCumulativeCount()))
		}
		if n := len(one.Bounds); n == 0 || !math.IsInf(one.Bounds[n-1], 1) { // the text format lists le="+Inf"; keep one
			one.Bounds = append(one.Bounds, math.Inf(1))
			one.Counts = append(one.Counts, float64(s.GetHistogram().GetSampleCount()))
		}
		one.Sum = s.GetHistogram().GetSampleSum()
		h = h.Add(one)
	}
	return h
}

// Add is h and o together; their bounds must be the same (or either
// empty).
func (h Histogram) Add(o Histogram) Histogram {
	if len(h.Bounds) == 0 {
		return Histogram{Bounds: slices.Clone(o.Bounds), Counts: slices.Clone(o.Counts), Sum: o.Sum}
	}
	if len(o.Bounds) == 0 || !slices.Equal(h.Bounds, o.Bounds) {
		return h
	}
	out := Histogram{Bounds: h.Bounds, Counts: slices.Clone(h.Counts), Sum: h.Sum + o.Sum}
	for i := range out.Counts {
		out.Counts[i] += o.Counts[i]
	}
	return out
}

// Minus is h less an earlier scrape o of the same histogram.
func (h Histogram) Minus(o Histogram) Histogram {
	if len(o.Bounds) == 0 || !slices.Equal(h.Bounds, o.Bounds) {
		return h
	}
	out := Histogram{Bounds: h.Bounds, Counts: slices.Clone(h.Counts), Sum: h.Sum - o.Sum}
	for i := range out.Counts {
		out.Counts[i] -= o.Counts[i]
	}
	return out
}

// Count is the observations.
func (h Histogram) Count() float64 {
	if len(h.Counts) == 0 {
		return 0
	}
	return h.Counts[len(h.Counts)-1]
}

// Quantile is the q-quantile's bucket's upper bound (an upper estimate, as
// no interpolation within a bucket is claimed); NaN with no observations,
// +Inf past the last finite bound.
func (h Histogram) Quantile(q float64) float64 {
	n := h.Count()
	if n == 0 {
		return math.NaN()
	}
	rank := q * n
	for i, c := range h.Counts {
		if c >= rank {
			return h.Bounds[i]
		}
	}
	return math.Inf(1)
}
