package llmtest

import (
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// KeyPiece is the shortest piece of an API key that counts as leaked: a
// prefix or a suffix that long, logged as an "id", still narrows the key
// down to a few candidates.
const KeyPiece = 8

// LeakedPiece returns the first piece of key, KeyPiece bytes long, that
// text holds. Any longer piece holds one of those.
func LeakedPiece(text, key string) (string, bool) {
	for i := 0; i+KeyPiece <= len(key); i++ {
		if p := key[i : i+KeyPiece]; strings.Contains(text, p) {
			return p, true
		}
	}
	return "", false
}

// LinesHolding returns the lines of text that hold piece, so that a
// failure shows where the key went without repeating a whole log.
func LinesHolding(text, piece string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, piece) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// MetricsText is every name, description, unit and attribute of rm, one
// data point a line, for a grep.
func MetricsText(rm metricdata.ResourceMetrics) string {
	var b strings.Builder
	attrs := func(set attribute.Set) {
		for _, kv := range set.ToSlice() {
			fmt.Fprintf(&b, " %s=%s", kv.Key, kv.Value.String())
		}
		b.WriteString("\n")
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			fmt.Fprintf(&b, "%s %s (%s) %s:", sm.Scope.Name, m.Name, m.Unit, m.Description)
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					attrs(p.Attributes)
				}
			case metricdata.Sum[float64]:
				for _, p := range d.DataPoints {
					attrs(p.Attributes)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					attrs(p.Attributes)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					attrs(p.Attributes)
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					attrs(p.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					attrs(p.Attributes)
				}
			default:
				fmt.Fprintf(&b, " data of type %T not searched\n", m.Data)
			}
		}
	}
	return b.String()
}
