package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store/storetest"
)

// The old path: how the store wrote and read its jsonb documents before it
// had records (protojson of the API messages, with these options). Rows
// written by it are in every database; records must write what it wrote
// and read what it wrote.
var (
	oldWrite = protojson.MarshalOptions{UseProtoNames: true}
	oldRead  = protojson.UnmarshalOptions{DiscardUnknown: true}
)

// document is one kind of jsonb document, its message and its record codec.
type document struct {
	name   string
	new    func() proto.Message
	encode func(proto.Message) ([]byte, error)
	decode func([]byte) (proto.Message, error)
}

func documentOf[M proto.Message](name string, encode func(M) ([]byte, error), decode func([]byte) (M, error)) document {
	return document{
		name:   name,
		new:    func() proto.Message { var m M; return m.ProtoReflect().New().Interface() },
		encode: func(m proto.Message) ([]byte, error) { return encode(m.(M)) },
		decode: func(b []byte) (proto.Message, error) { return decode(b) },
	}
}

var documents = []document{
	documentOf("run.spec", encodeSpec, decodeSpec),
	documentOf("task.outcome", encodeOutcome, decodeOutcome),
	documentOf("run.result", encodeResult, decodeResult),
	documentOf("run_event.event", encodeEvent, decodeEvent),
}

func documentFor(t *testing.T, m proto.Message) document {
	t.Helper()
	for _, d := range documents {
		if d.new().ProtoReflect().Descriptor() == m.ProtoReflect().Descriptor() {
			return d
		}
	}
	t.Fatalf("no document holds a %T", m)
	return document{}
}

// TestRecordsWriteWhatProtojsonWrote: every document, with every field of
// its message set (recursively, and each member of each oneof in turn),
// encodes through its record to the JSON the old path wrote for it, and
// reads back equal, from the record's JSON and from the old path's. A field
// added to the API fails here until the record carries it.
func TestRecordsWriteWhatProtojsonWrote(t *testing.T) {
	for _, d := range documents {
		for choice := range oneofChoices(d.new().ProtoReflect().Descriptor()) {
			m := d.new()
			n := 0
			populate(t, m.ProtoReflect(), choice, &n, 0)
			t.Run(fmt.Sprintf("%s/%d", d.name, choice), func(t *testing.T) { checkRecord(t, d, m) })
		}
	}
}

// TestRecordsOfEdgeValues: values where protojson's choices show (what it
// leaves out, -0, NaN, the ends of every range, fractions of seconds,
// unknown enum numbers, empty and nil messages, escaping) are written and
// read as it did.
func TestRecordsOfEdgeValues(t *testing.T) {
	negZero := math.Copysign(0, -1)
	cases := []proto.Message{
		(*fanoutv1.RunSpec)(nil),
		&fanoutv1.RunSpec{},
		&fanoutv1.RunSpec{Budget: &fanoutv1.Budget{}, Limits: &fanoutv1.Limits{RunTimeout: &durationpb.Duration{}},
			Model: &fanoutv1.ModelSettings{}, Labels: map[string]string{}, Tasks: []*fanoutv1.TaskSpec{{}, nil}},
		&fanoutv1.RunSpec{Labels: map[string]string{"é<&>": "\u2028\x00\"\\/\t", "": "", "b": "<script>"}},
		&fanoutv1.TaskOutcome{Status: fanoutv1.TaskStatus(42), TokensSpent: math.MaxInt64,
			Summary: &fanoutv1.FactSummary{TokensSpent: math.MinInt64, Iterations: math.MinInt32}},
		&fanoutv1.TaskOutcome{Summary: &fanoutv1.FactSummary{}, DispatchIndex: math.MaxInt32},
		&fanoutv1.JoinedResult{Tasks: []*fanoutv1.TaskOutcome{nil, {TaskId: "t"}}, Facts: []*fanoutv1.Fact{{}}},
		&fanoutv1.RunEvent{},
		&fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskFinished{}},
		&fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunStarted{RunStarted: &fanoutv1.RunStarted{}}},
		&fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunFinished{RunFinished: &fanoutv1.RunFinished{
			State: fanoutv1.RunState(-3), Result: &fanoutv1.JoinedResult{}}}},
	}
	for _, f := range []float64{negZero, math.NaN(), math.Inf(1), math.Inf(-1), 0.7, 2, 1e21, 1e20, 1e-7, 1e-6,
		123456789.125, math.MaxFloat64, math.SmallestNonzeroFloat64, -1.5} {
		cases = append(cases, &fanoutv1.RunSpec{Model: &fanoutv1.ModelSettings{Temperature: f}})
	}
	for _, d := range []*durationpb.Duration{{Seconds: -1, Nanos: -500_000_000}, {Nanos: 1}, {Nanos: -1_000_000},
		{Seconds: 315576000000, Nanos: 999_999_999}, {Seconds: -315576000000, Nanos: -999_999_999},
		{Seconds: 5}, {Nanos: 120_000}, {Seconds: -7}} {
		cases = append(cases, &fanoutv1.RunSpec{Tasks: []*fanoutv1.TaskSpec{{Timeout: d}}})
	}
	for _, ts := range []*timestamppb.Timestamp{{}, {Seconds: -62135596800}, {Seconds: 253402300799, Nanos: 999_999_999},
		{Seconds: 1, Nanos: 1000}, {Seconds: 1, Nanos: 1_000_000}, {Seconds: -1, Nanos: 1}, {Seconds: 1_700_000_000, Nanos: 10}} {
		cases = append(cases, &fanoutv1.TaskOutcome{StartedAt: ts, FinishedAt: ts})
	}
	for i, m := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) { checkRecord(t, documentFor(t, m), m) })
	}
}

// TestRecordEnumNames: each enum table of the records names every value
// of its API enum as the API does, and nothing else.
func TestRecordEnumNames(t *testing.T) {
	for _, c := range []struct {
		names enumNames
		enum  protoreflect.EnumDescriptor
	}{
		{stateNames, fanoutv1.RunState(0).Descriptor()},
		{statusNames, fanoutv1.TaskStatus(0).Descriptor()},
		{exhaustNames, fanoutv1.ExhaustionPolicy(0).Descriptor()},
		{joinNames, fanoutv1.JoinPolicy(0).Descriptor()},
		{hedgeAttemptNames, fanoutv1.HedgeAttempt(0).Descriptor()},
	} {
		values := c.enum.Values()
		if len(c.names.name) != values.Len() || len(c.names.number) != values.Len() {
			t.Errorf("%s: the table has %d names, %d numbers; the enum %d values",
				c.enum.Name(), len(c.names.name), len(c.names.number), values.Len())
		}
		for i := range values.Len() {
			v := values.Get(i)
			if got := c.names.name[int32(v.Number())]; got != string(v.Name()) {
				t.Errorf("%s %d is written %q, want %q", c.enum.Name(), v.Number(), got, v.Name())
			}
			if got, ok := c.names.number[string(v.Name())]; !ok || got != int32(v.Number()) {
				t.Errorf("%s reads as %d, want %d", v.Name(), got, v.Number())
			}
		}
	}
}

// TestRecordsReadWhatProtojsonRead: documents in forms the old path did not
// write but read (a hand-made row, a field of a newer binary), and the
// forms PostgreSQL gives back, read as the old path read them.
func TestRecordsReadWhatProtojsonRead(t *testing.T) {
	for _, c := range []struct {
		m    proto.Message
		json string
	}{
		{&fanoutv1.TaskOutcome{}, `{"tokens_spent": 42, "dispatch_index": 3, "status": 4}`},
		{&fanoutv1.TaskOutcome{}, `{"tokens_spent": "-9223372036854775808", "worker": "w"}`},
		{&fanoutv1.TaskOutcome{}, `{"tokens_spent": 1e3, "summary": {"tokens_spent": "2.0E2"}}`},
		{&fanoutv1.TaskOutcome{}, `{"status": "TASK_STATUS_FROM_THE_FUTURE", "summary": {"status": "TASK_STATUS_FAILED"}}`},
		{&fanoutv1.TaskOutcome{}, `{"status": null, "summary": null, "started_at": null, "task_id": null}`},
		{&fanoutv1.TaskOutcome{}, `{"started_at": "2024-05-01T12:00:00.5+02:00", "finished_at": "2024-05-01T10:00:00.123456789Z"}`},
		{&fanoutv1.TaskOutcome{}, `{"started_at": "0001-01-01T00:00:00Z", "finished_at": "9999-12-31T23:59:59.999999999Z"}`},
		{&fanoutv1.TaskOutcome{}, `{"summary": {"error": "x", "newer": {"a": [1, "b"]}}, "newer_field": 1}`},
		{&fanoutv1.RunSpec{}, `{"tasks": [{"timeout": "1.5s"}, {"timeout": "-.5s"}, {"timeout": "+3s"}, {"timeout": "1.s"}, {"timeout": ".s"}]}`},
		{&fanoutv1.RunSpec{}, `{"limits": {"run_timeout": "-0.000000001s"}, "model": {"temperature": "0.5", "seed": "7"}}`},
		{&fanoutv1.RunSpec{}, `{"model": {"temperature": 0.00000015}, "budget": {"limit_tokens": "100"}}`},
		{&fanoutv1.RunSpec{}, `{"model": {"temperature": "NaN"}, "on_exhaustion": "EXHAUSTION_POLICY_DRAIN", "join_policy": 3}`},
		{&fanoutv1.RunSpec{}, `{"labels": {"a": "b"}, "tasks": [{"depends_on": ["x", "y"], "allowed_tools": []}]}`},
		{&fanoutv1.RunEvent{}, `{"task_iteration": {"task_id": "t", "iteration": 2, "tokens_spent": "5", "tool_calls": 1}}`},
		{&fanoutv1.RunEvent{}, `{"run_finished": {}, "sequence": "3", "time": "2024-01-01T00:00:00Z"}`},
		{&fanoutv1.RunEvent{}, `{"a_newer_event": {"x": 1}}`},
	} {
		d := documentFor(t, c.m)
		want := c.m
		if err := oldRead.Unmarshal([]byte(c.json), want); err != nil {
			t.Fatalf("the old path does not read %s: %v", c.json, err)
		}
		got, err := d.decode([]byte(c.json))
		if err != nil || !proto.Equal(got, want) {
			t.Errorf("%s reads as %v, %v; the old path read %v", c.json, got, err, want)
		}
	}
}

// TestRecordsRefuseWhatProtojsonRefused: a message the old path could not
// write, and a document it could not read, are refused.
func TestRecordsRefuseWhatProtojsonRefused(t *testing.T) {
	for _, m := range []proto.Message{
		&fanoutv1.RunSpec{Goal: "bad \xff UTF-8"},
		&fanoutv1.RunSpec{Labels: map[string]string{"\xc3": "key"}},
		&fanoutv1.RunSpec{Tasks: []*fanoutv1.TaskSpec{{DependsOn: []string{"ok", "\xe2\x82"}}}},
		&fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunStarted{RunStarted: &fanoutv1.RunStarted{
			Run: &fanoutv1.Run{Result: &fanoutv1.JoinedResult{Facts: []*fanoutv1.Fact{{Sources: []string{"\x80"}}}}}}}},
		&fanoutv1.TaskOutcome{StartedAt: &timestamppb.Timestamp{Seconds: 253402300800}},
		&fanoutv1.TaskOutcome{StartedAt: &timestamppb.Timestamp{Seconds: -62135596801}},
		&fanoutv1.TaskOutcome{StartedAt: &timestamppb.Timestamp{Nanos: -1}},
		&fanoutv1.TaskOutcome{StartedAt: &timestamppb.Timestamp{Nanos: 1e9}},
		&fanoutv1.RunSpec{Limits: &fanoutv1.Limits{RunTimeout: &durationpb.Duration{Seconds: 1, Nanos: -1}}},
		&fanoutv1.RunSpec{Limits: &fanoutv1.Limits{RunTimeout: &durationpb.Duration{Seconds: 315576000001}}},
		&fanoutv1.RunSpec{Limits: &fanoutv1.Limits{RunTimeout: &durationpb.Duration{Nanos: 1e9}}},
	} {
		if _, err := oldWrite.Marshal(m); err == nil {
			t.Fatalf("the old path writes %v", m)
		}
		if b, err := documentFor(t, m).encode(m); err == nil {
			t.Errorf("%v is written as %s, want an error", m, b)
		}
	}
	for _, c := range []struct {
		m    proto.Message
		json string
	}{
		{&fanoutv1.TaskOutcome{}, `{"started_at": "2024-05-01 12:00:00Z"}`},
		{&fanoutv1.TaskOutcome{}, `{"started_at": "2024-05-01T12:00:00.1234567891Z"}`},
		{&fanoutv1.TaskOutcome{}, `{"started_at": "10000-01-01T00:00:00Z"}`},
		{&fanoutv1.TaskOutcome{}, `{"started_at": 1714564800}`},
		{&fanoutv1.TaskOutcome{}, `{"tokens_spent": "1.5"}`},
		{&fanoutv1.TaskOutcome{}, `{"tokens_spent": " 1"}`},
		{&fanoutv1.TaskOutcome{}, `{"tokens_spent": true}`},
		{&fanoutv1.TaskOutcome{}, `{"status": 1.5}`},
		{&fanoutv1.RunSpec{}, `{"limits": {"run_timeout": "1.0000000001s"}}`},
		{&fanoutv1.RunSpec{}, `{"limits": {"run_timeout": "01s"}}`},
		{&fanoutv1.RunSpec{}, `{"limits": {"run_timeout": "-s"}}`},
		{&fanoutv1.RunSpec{}, `{"limits": {"run_timeout": "1m"}}`},
		{&fanoutv1.RunSpec{}, `{"limits": {"run_timeout": "315576000001s"}}`},
		{&fanoutv1.RunSpec{}, `{"limits": {"run_timeout": 3}}`},
		{&fanoutv1.RunSpec{}, `{"model": {"temperature": "warm"}}`},
		{&fanoutv1.RunSpec{}, `{"goal": 3}`},
		{&fanoutv1.RunSpec{}, `[]`},
	} {
		if err := oldRead.Unmarshal([]byte(c.json), c.m); err == nil {
			t.Fatalf("the old path reads %s", c.json)
		}
		if got, err := documentFor(t, c.m).decode([]byte(c.json)); err == nil {
			t.Errorf("%s reads as %v, want an error", c.json, got)
		}
	}
}

// TestRowsOfTheOldPathReadBack: rows the old path wrote read back through
// the store as they were written, the SQL over them reads the same
// (task.outcome_error), and PostgreSQL finds a record's document equal
// (jsonb =) to the old path's, as FailTasks and FinishTask compare
// outcomes after a lost reply.
func TestRowsOfTheOldPathReadBack(t *testing.T) {
	ctx := t.Context()
	pool, err := Open(ctx, storetest.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	populated := func(m proto.Message, choice int) proto.Message {
		n := 0
		populate(t, m.ProtoReflect(), choice, &n, 0)
		return m
	}
	old := func(m proto.Message) []byte {
		b, err := oldWrite.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, d := range documents {
		for choice := range oneofChoices(d.new().ProtoReflect().Descriptor()) {
			m := populated(d.new(), choice)
			b, err := d.encode(m)
			if err != nil {
				t.Fatal(err)
			}
			var equal bool
			var stored string
			if err := pool.QueryRow(ctx, `SELECT $1::jsonb = $2::jsonb, $2::jsonb::text`, b, old(m)).Scan(&equal, &stored); err != nil {
				t.Fatal(err)
			}
			if !equal {
				t.Errorf("%s: PostgreSQL finds the record's %s unequal to the old path's %s", d.name, b, old(m))
			}
			if back, err := d.decode([]byte(stored)); err != nil || !proto.Equal(back, m) {
				t.Errorf("%s: the old path's row %s reads back as %v, %v", d.name, stored, back, err)
			}
		}
	}

	rs := NewRuns(pool)
	spec := populated(&fanoutv1.RunSpec{}, 0).(*fanoutv1.RunSpec)
	if _, _, err := rs.CreateRun(ctx, &fanoutv1.Run{RunId: "r1", TenantId: "ten", IdempotencyKey: "k", Spec: spec,
		Tasks: []*fanoutv1.TaskOutcome{{TaskId: "a"}}}, "n1"); err != nil {
		t.Fatal(err)
	}
	outcome := populated(&fanoutv1.TaskOutcome{}, 0).(*fanoutv1.TaskOutcome)
	outcome.TaskId, outcome.DispatchIndex, outcome.Status = "a", 0, fanoutv1.TaskStatus_TASK_STATUS_FAILED
	stored := proto.CloneOf(outcome)
	stored.StartedAt, stored.FinishedAt = nil, nil
	result := populated(&fanoutv1.JoinedResult{}, 0)
	var events []*fanoutv1.RunEvent
	for choice := range oneofChoices(fanoutv1.File_fanout_v1_run_proto.Messages().ByName("RunEvent")) {
		ev := populated(&fanoutv1.RunEvent{}, choice).(*fanoutv1.RunEvent)
		ev.RunId, ev.Sequence, ev.Time = "", 0, nil
		events = append(events, ev)
	}
	if _, err := rs.AppendEvents(ctx, "r1", events); err != nil {
		t.Fatal(err)
	}
	// What the old path would have stored, in place of what the records did.
	batch := []struct {
		sql  string
		args []any
	}{
		{`UPDATE run SET spec = $1, result = $2 WHERE run_id = 'r1'`, []any{old(spec), old(result)}},
		{`UPDATE task SET status = $1, outcome = $2, tokens_spent = $3, worker = $4, started_at = now(), finished_at = now()
			WHERE run_id = 'r1' AND task_id = 'a'`, []any{runs.Text(outcome.GetStatus()), old(stored), outcome.GetTokensSpent(), outcome.GetWorker()}},
	}
	for i, ev := range events {
		batch = append(batch, struct {
			sql  string
			args []any
		}{`UPDATE run_event SET event = $1 WHERE run_id = 'r1' AND sequence = $2`, []any{old(ev), i + 1}})
	}
	for _, q := range batch {
		if tag, err := pool.Exec(ctx, q.sql, q.args...); err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("%s: %v, %d rows", q.sql, err, tag.RowsAffected())
		}
	}

	run, err := rs.GetRun(ctx, "ten", "r1")
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(run.GetSpec(), spec) || !proto.Equal(run.GetResult(), result) {
		t.Errorf("the old path's spec and result read back as\n%v\n%v\nwant\n%v\n%v", run.GetSpec(), run.GetResult(), spec, result)
	}
	got := proto.CloneOf(run.GetTasks()[0])
	got.StartedAt, got.FinishedAt = nil, nil
	if !proto.Equal(got, stored) {
		t.Errorf("the old path's outcome reads back as\n%v\nwant\n%v", got, stored)
	}
	var outcomeError string
	if err := pool.QueryRow(ctx, `SELECT outcome_error FROM task WHERE run_id = 'r1' AND task_id = 'a'`).Scan(&outcomeError); err != nil || outcomeError != outcome.GetSummary().GetError() {
		t.Errorf("task.outcome_error = %q, %v; want %q", outcomeError, err, outcome.GetSummary().GetError())
	}
	if mine, err := rs.finishedAs(ctx, "r1", outcome); err != nil || mine == nil {
		t.Errorf("a FinishTask retried after a lost reply does not find the outcome the old path stored: %v, %v", mine, err)
	}
	read, err := rs.Events(ctx, "ten", "r1", 0, 100)
	if err != nil || len(read) != len(events) {
		t.Fatalf("events: %d, %v; want %d", len(read), err, len(events))
	}
	for i, ev := range read {
		ev = proto.CloneOf(ev)
		ev.RunId, ev.Sequence, ev.Time = "", 0, nil
		if !proto.Equal(ev, events[i]) {
			t.Errorf("the old path's event %d reads back as\n%v\nwant\n%v", i+1, ev, events[i])
		}
	}
}

// checkRecord checks that m's document is what the old path wrote, as JSON
// values, and reads back equal to m, as the old path's document does.
func checkRecord(t *testing.T, d document, m proto.Message) {
	t.Helper()
	got, err := d.encode(m)
	if err != nil {
		t.Fatalf("encode %v: %v", m, err)
	}
	want, err := oldWrite.Marshal(m)
	if err != nil {
		t.Fatalf("the old path cannot encode %v: %v", m, err)
	}
	if !m.ProtoReflect().IsValid() {
		want = []byte("{}") // as the old path stored a nil message
	}
	if !sameJSON(t, got, want) {
		t.Errorf("%s: the record writes\n%s\nthe old path wrote\n%s", d.name, got, want)
	}
	if !json.Valid(got) || bytes.ContainsAny(got, "\n") {
		t.Errorf("not one line of JSON: %s", got)
	}
	wantBack := d.new()
	if err := oldRead.Unmarshal(want, wantBack); err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{got, want} {
		back, err := d.decode(b)
		if err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
		if !proto.Equal(back, wantBack) || m.ProtoReflect().IsValid() && !proto.Equal(back, m) {
			t.Errorf("%s reads back as\n%v\nwant\n%v", b, back, m)
		}
	}
}

// sameJSON reports whether a and b hold the same JSON value (numbers
// compared as written: both writers format a double alike).
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	for _, x := range []struct {
		b []byte
		v *any
	}{{a, &va}, {b, &vb}} {
		dec := json.NewDecoder(bytes.NewReader(x.b))
		dec.UseNumber()
		if err := dec.Decode(x.v); err != nil {
			t.Fatalf("%s: %v", x.b, err)
		}
	}
	return reflect.DeepEqual(va, vb)
}

// oneofChoices is how many messages it takes to set each member of every
// oneof in the message, and in the messages it holds, at least once.
func oneofChoices(d protoreflect.MessageDescriptor) int {
	n := 1
	seen := map[protoreflect.FullName]bool{}
	var walk func(d protoreflect.MessageDescriptor)
	walk = func(d protoreflect.MessageDescriptor) {
		if seen[d.FullName()] {
			return
		}
		seen[d.FullName()] = true
		for i := range d.Oneofs().Len() {
			n = max(n, d.Oneofs().Get(i).Fields().Len())
		}
		for i := range d.Fields().Len() {
			if m := d.Fields().Get(i).Message(); m != nil {
				walk(m)
			}
		}
	}
	walk(d)
	return n
}

// populate sets every field of m, recursively, to a value that is not its
// zero and differs from every other field's (n counts them): two elements
// in each list and map; of each oneof, the member choice picks.
func populate(t *testing.T, m protoreflect.Message, choice int, n *int, depth int) {
	t.Helper()
	if depth > 8 {
		t.Fatalf("populate: %s nests too deep", m.Descriptor().FullName())
	}
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if o := fd.ContainingOneof(); o != nil && o.Fields().Get(choice%o.Fields().Len()) != fd {
			continue
		}
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range 2 {
				l.Append(fieldValue(t, fd, l.NewElement, choice, n, depth))
			}
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for range 2 {
				k := fieldValue(t, fd.MapKey(), nil, choice, n, depth).MapKey()
				mp.Set(k, fieldValue(t, fd.MapValue(), mp.NewValue, choice, n, depth))
			}
		case fd.Message() != nil:
			populateMessage(t, fd, m.Mutable(fd).Message(), choice, n, depth)
		default:
			m.Set(fd, fieldValue(t, fd, nil, choice, n, depth))
		}
	}
}

func fieldValue(t *testing.T, fd protoreflect.FieldDescriptor, newMessage func() protoreflect.Value, choice int, n *int, depth int) protoreflect.Value {
	t.Helper()
	*n++
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("%s %d <é&\"\\>", fd.Name(), *n))
	case protoreflect.Int32Kind:
		return protoreflect.ValueOfInt32(int32(1000 + *n))
	case protoreflect.Int64Kind:
		return protoreflect.ValueOfInt64(1<<60 + int64(*n)) // beyond a double's exact integers
	case protoreflect.Uint32Kind:
		return protoreflect.ValueOfUint32(uint32(3_000_000_000 + *n)) // beyond an int32
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(*n) * 1.25e-7)
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		values := fd.Enum().Values()
		return protoreflect.ValueOfEnum(values.Get(1 + *n%(values.Len()-1)).Number())
	case protoreflect.MessageKind:
		v := newMessage()
		populateMessage(t, fd, v.Message(), choice, n, depth)
		return v
	}
	t.Fatalf("populate: field %s is a %s; teach populate (and the records) that kind", fd.FullName(), fd.Kind())
	return protoreflect.Value{}
}

func populateMessage(t *testing.T, fd protoreflect.FieldDescriptor, m protoreflect.Message, choice int, n *int, depth int) {
	t.Helper()
	*n++
	switch fd.Message().FullName() {
	case "google.protobuf.Timestamp":
		proto.Merge(m.Interface(), &timestamppb.Timestamp{Seconds: 1_700_000_000 + int64(*n), Nanos: 123_456_000})
	case "google.protobuf.Duration":
		proto.Merge(m.Interface(), &durationpb.Duration{Seconds: 90 + int64(*n), Nanos: 500_000_000})
	default:
		if fd.Message().FullName().Parent() != "fanout.v1" {
			t.Fatalf("populate: field %s is a %s; teach populate (and the records) that message", fd.FullName(), fd.Message().FullName())
		}
		populate(t, m, choice, n, depth+1)
	}
}
