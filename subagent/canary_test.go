package subagent_test

import (
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// keyPiece is the shortest piece of an API key that counts as leaked: a
// prefix or a suffix that long, logged as an "id", still narrows the key
// down to a few candidates.
const keyPiece = 8

// leakedPiece returns the first piece of key, keyPiece bytes long, that
// text holds. Any longer piece holds one of those.
func leakedPiece(text, key string) (string, bool) {
	for i := 0; i+keyPiece <= len(key); i++ {
		if p := key[i : i+keyPiece]; strings.Contains(text, p) {
			return p, true
		}
	}
	return "", false
}

// linesHolding returns the lines of text that hold piece.
func linesHolding(text, piece string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, piece) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// metricsText is every name, description, unit and attribute of rm, one
// data point a line, for a grep.
func metricsText(rm metricdata.ResourceMetrics) string {
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
