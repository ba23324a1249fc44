package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/reflect/protoreflect"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// Watch follows run id with WatchRun from its first event to RunFinished,
// showing each event to onEvent (if set), and returns the RunFinished. A
// stream that ends before it is an error.
func Watch(ctx context.Context, client fanoutv1.OrchestratorServiceClient, id string, onEvent func(*fanoutv1.RunEvent),
	opts ...grpc.CallOption) (*fanoutv1.RunFinished, error) {
	stream, err := client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: id}, opts...)
	if err != nil {
		return nil, fmt.Errorf("WatchRun %s: %w", id, err)
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("WatchRun %s: the stream ended without RunFinished", id)
		}
		if err != nil {
			return nil, fmt.Errorf("WatchRun %s: %w", id, err)
		}
		ev := m.GetEvent()
		if onEvent != nil {
			onEvent(ev)
		}
		if fin := ev.GetRunFinished(); fin != nil {
			return fin, nil
		}
	}
}

// EventKind is the name of the field of ev's oneof that is set
// ("task_started", "run_finished"), or "" if none is: a bench built
// against one proto can name, count and print the kinds a newer server
// sends that it has no Go field for only if they are in its proto, so it
// asks the message itself.
func EventKind(ev *fanoutv1.RunEvent) string {
	m := ev.ProtoReflect()
	oneof := m.Descriptor().Oneofs().ByName("event")
	if oneof == nil {
		return ""
	}
	if f := m.WhichOneof(oneof); f != nil {
		return string(f.Name())
	}
	return ""
}

// EventNumber is the integer field of ev's event named want, or else the
// first whose name holds it (depth first, in field order): "concurrency"
// finds a chosen-concurrency event's number whatever the event is called,
// and its "concurrency" before a "previous_concurrency". It reports
// whether there is one.
func EventNumber(ev *fanoutv1.RunEvent, want string) (int64, bool) {
	m := ev.ProtoReflect()
	oneof := m.Descriptor().Oneofs().ByName("event")
	if oneof == nil {
		return 0, false
	}
	f := m.WhichOneof(oneof)
	if f == nil || f.Kind() != protoreflect.MessageKind {
		return 0, false
	}
	msg := m.Get(f).Message()
	if v, ok := intField(msg, want, true); ok {
		return v, true
	}
	return intField(msg, want, false)
}

// intField is the first integer field of m named want (exact) or whose
// name holds it.
func intField(m protoreflect.Message, want string, exact bool) (int64, bool) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if f.IsList() || f.IsMap() || !m.Has(f) {
			continue
		}
		switch f.Kind() {
		case protoreflect.Int32Kind, protoreflect.Int64Kind, protoreflect.Uint32Kind, protoreflect.Uint64Kind,
			protoreflect.Sint32Kind, protoreflect.Sint64Kind:
			if name := string(f.Name()); name == want || !exact && strings.Contains(name, want) {
				v := m.Get(f)
				if f.Kind() == protoreflect.Uint32Kind || f.Kind() == protoreflect.Uint64Kind {
					return int64(v.Uint()), true
				}
				return v.Int(), true
			}
		case protoreflect.MessageKind:
			if v, ok := intField(m.Get(f).Message(), want, exact); ok {
				return v, true
			}
		}
	}
	return 0, false
}

// Quantile is the q-quantile of ds by the nearest rank (the smallest value
// with at least q of them at or below it), or 0 for none.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[max(0, min(len(s)-1, int(math.Ceil(q*float64(len(s))))-1))]
}
