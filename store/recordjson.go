package store

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// The JSON of the records' scalars, as protojson writes them: int64 as a
// string, doubles, Timestamp and Duration as text, enums by their value
// names (records.go says why).

// int64JSON is an int64 as protojson writes one: a JSON string, "42". It
// reads a string or a number.
type int64JSON int64

func (n int64JSON) MarshalJSON() ([]byte, error) {
	return strconv.AppendQuote(nil, strconv.FormatInt(int64(n), 10)), nil
}

func (n *int64JSON) UnmarshalJSON(b []byte) error {
	s, err := unquoteNumber(b)
	if err != nil || s == "" {
		return err
	}
	i, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// A number written with a fraction or an exponent ("1e3"), as
		// protojson also read it; exact up to 2^53.
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
			return fmt.Errorf("%s is not an int64", b)
		}
		i = int64(f)
	}
	*n = int64JSON(i)
	return nil
}

// unquoteNumber returns the text of a JSON number, or of a string that
// holds one; "" for null.
func unquoteNumber(b []byte) (string, error) {
	if string(b) == "null" {
		return "", nil
	}
	if len(b) == 0 || b[0] != '"' {
		return string(b), nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return "", err
	}
	if s == "" || strings.TrimSpace(s) != s {
		return "", fmt.Errorf("%s is not a number", b)
	}
	return s, nil
}

// doubleJSON is a double as protojson writes one: a JSON number, or "NaN",
// "Infinity", "-Infinity"; -0 is not zero (it is written).
type doubleJSON float64

func (d doubleJSON) IsZero() bool { return math.Float64bits(float64(d)) == 0 }

func (d doubleJSON) MarshalJSON() ([]byte, error) {
	switch f := float64(d); {
	case math.IsNaN(f):
		return []byte(`"NaN"`), nil
	case math.IsInf(f, 1):
		return []byte(`"Infinity"`), nil
	case math.IsInf(f, -1):
		return []byte(`"-Infinity"`), nil
	}
	return json.Marshal(float64(d))
}

func (d *doubleJSON) UnmarshalJSON(b []byte) error {
	s, err := unquoteNumber(b)
	if err != nil || s == "" {
		return err
	}
	switch s {
	case "NaN":
		*d = doubleJSON(math.NaN())
	case "Infinity":
		*d = doubleJSON(math.Inf(1))
	case "-Infinity":
		*d = doubleJSON(math.Inf(-1))
	default:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("%s is not a double", b)
		}
		*d = doubleJSON(f)
	}
	return nil
}

// timestampJSON is a google.protobuf.Timestamp as protojson writes one:
// RFC 3339 in UTC, with 0, 3, 6 or 9 fractional digits.
type timestampJSON struct {
	seconds int64
	nanos   int32
}

// The range of a Timestamp: years 1 to 9999.
const minTimestamp, maxTimestamp = -62135596800, 253402300799

func timestampOf(t *timestamppb.Timestamp) *timestampJSON {
	if t == nil {
		return nil
	}
	return &timestampJSON{t.GetSeconds(), t.GetNanos()}
}

func (t *timestampJSON) proto() *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return &timestamppb.Timestamp{Seconds: t.seconds, Nanos: t.nanos}
}

func (t timestampJSON) MarshalJSON() ([]byte, error) {
	if t.seconds < minTimestamp || t.seconds > maxTimestamp || t.nanos < 0 || t.nanos > 999_999_999 {
		return nil, fmt.Errorf("timestamp out of range: %d s %d ns", t.seconds, t.nanos)
	}
	s := time.Unix(t.seconds, int64(t.nanos)).UTC().Format("2006-01-02T15:04:05.000000000")
	return strconv.AppendQuote(nil, trimFraction(s)+"Z"), nil
}

func (t *timestampJSON) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("timestamp %s: %w", b, err)
	}
	v, err := time.Parse(time.RFC3339Nano, s)
	frac, zone := strings.LastIndexByte(s, '.'), strings.LastIndexAny(s, "Z-+")
	switch {
	case err != nil:
		return fmt.Errorf("timestamp %s: %w", b, err)
	case v.Unix() < minTimestamp || v.Unix() > maxTimestamp,
		frac >= 0 && zone >= frac && zone-frac > len(".999999999"):
		return fmt.Errorf("timestamp %s out of range", b)
	}
	*t = timestampJSON{v.Unix(), int32(v.Nanosecond())}
	return nil
}

// trimFraction drops trailing groups of three zeros from the nine
// fractional digits, and the point if none are left, as protojson does.
func trimFraction(s string) string {
	s = strings.TrimSuffix(s, "000")
	s = strings.TrimSuffix(s, "000")
	return strings.TrimSuffix(s, ".000")
}

// durationJSON is a google.protobuf.Duration as protojson writes one:
// seconds with 0, 3, 6 or 9 fractional digits and the suffix s, "-1.500s".
type durationJSON struct {
	seconds int64
	nanos   int32
}

// maxDuration is the range of a Duration in seconds, either way: 10,000
// years.
const maxDuration = 315576000000

func durationOf(d *durationpb.Duration) *durationJSON {
	if d == nil {
		return nil
	}
	return &durationJSON{d.GetSeconds(), d.GetNanos()}
}

func (d *durationJSON) proto() *durationpb.Duration {
	if d == nil {
		return nil
	}
	return &durationpb.Duration{Seconds: d.seconds, Nanos: d.nanos}
}

func (d durationJSON) MarshalJSON() ([]byte, error) {
	secs, nanos := d.seconds, d.nanos
	if secs < -maxDuration || secs > maxDuration || nanos < -999_999_999 || nanos > 999_999_999 ||
		secs > 0 && nanos < 0 || secs < 0 && nanos > 0 {
		return nil, fmt.Errorf("duration out of range: %d s %d ns", secs, nanos)
	}
	sign := ""
	if secs < 0 || nanos < 0 {
		sign, secs, nanos = "-", -secs, -nanos
	}
	return strconv.AppendQuote(nil, trimFraction(fmt.Sprintf("%s%d.%09d", sign, secs, nanos))+"s"), nil
}

// durationText is what protojson reads as a Duration: a sign, an integer
// part, a fraction of at most nine digits (either part may be missing, not
// both) and s.
var durationText = regexp.MustCompile(`^([+-]?)(0|[1-9][0-9]*)?(?:(\.)([0-9]{0,9}))?s$`)

func (d *durationJSON) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration %s: %w", b, err)
	}
	m := durationText.FindStringSubmatch(s)
	if m == nil || m[2] == "" && m[3] == "" {
		return fmt.Errorf("%s is not a duration", b)
	}
	var secs, nanos int64
	var err error
	if m[2] != "" {
		secs, err = strconv.ParseInt(m[2], 10, 64)
	}
	if err != nil || secs > maxDuration {
		return fmt.Errorf("duration %s out of range", b)
	}
	if m[4] != "" {
		nanos, _ = strconv.ParseInt((m[4] + "00000000")[:9], 10, 64)
	}
	if m[1] == "-" {
		secs, nanos = -secs, -nanos
	}
	*d = durationJSON{secs, int32(nanos)}
	return nil
}

// The enums of the documents, by their value names. The names are written
// out in these tables (records_test.go checks them against the API's), so
// that a renamed value of the API is still stored as before. A value not
// in a table is written as its number, as protojson wrote it; a name not in
// a table reads as unset, as protojson (discarding what it did not know)
// read it.
type (
	runStateJSON     fanoutv1.RunState
	taskStatusJSON   fanoutv1.TaskStatus
	exhaustionJSON   fanoutv1.ExhaustionPolicy
	admissionJSON    fanoutv1.AdmissionPolicy
	joinPolicyJSON   fanoutv1.JoinPolicy
	hedgeAttemptJSON fanoutv1.HedgeAttempt
)

var (
	stateNames = enumNamesOf(map[fanoutv1.RunState]string{
		fanoutv1.RunState_RUN_STATE_UNSPECIFIED:      "RUN_STATE_UNSPECIFIED",
		fanoutv1.RunState_RUN_STATE_RUNNING:          "RUN_STATE_RUNNING",
		fanoutv1.RunState_RUN_STATE_SUCCEEDED:        "RUN_STATE_SUCCEEDED",
		fanoutv1.RunState_RUN_STATE_FAILED:           "RUN_STATE_FAILED",
		fanoutv1.RunState_RUN_STATE_CANCELLED:        "RUN_STATE_CANCELLED",
		fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED: "RUN_STATE_BUDGET_EXHAUSTED",
		fanoutv1.RunState_RUN_STATE_TIMED_OUT:        "RUN_STATE_TIMED_OUT",
	})
	statusNames = enumNamesOf(map[fanoutv1.TaskStatus]string{
		fanoutv1.TaskStatus_TASK_STATUS_UNSPECIFIED:      "TASK_STATUS_UNSPECIFIED",
		fanoutv1.TaskStatus_TASK_STATUS_PENDING:          "TASK_STATUS_PENDING",
		fanoutv1.TaskStatus_TASK_STATUS_RUNNING:          "TASK_STATUS_RUNNING",
		fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED:        "TASK_STATUS_SUCCEEDED",
		fanoutv1.TaskStatus_TASK_STATUS_FAILED:           "TASK_STATUS_FAILED",
		fanoutv1.TaskStatus_TASK_STATUS_TIMED_OUT:        "TASK_STATUS_TIMED_OUT",
		fanoutv1.TaskStatus_TASK_STATUS_CANCELLED:        "TASK_STATUS_CANCELLED",
		fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED: "TASK_STATUS_BUDGET_EXHAUSTED",
		fanoutv1.TaskStatus_TASK_STATUS_ITERATION_LIMIT:  "TASK_STATUS_ITERATION_LIMIT",
		fanoutv1.TaskStatus_TASK_STATUS_SKIPPED:          "TASK_STATUS_SKIPPED",
		fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED:      "TASK_STATUS_NOT_STARTED",
	})
	exhaustNames = enumNamesOf(map[fanoutv1.ExhaustionPolicy]string{
		fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_UNSPECIFIED: "EXHAUSTION_POLICY_UNSPECIFIED",
		fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_CANCEL:      "EXHAUSTION_POLICY_CANCEL",
		fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_DRAIN:       "EXHAUSTION_POLICY_DRAIN",
	})
	admissionNames = enumNamesOf(map[fanoutv1.AdmissionPolicy]string{
		fanoutv1.AdmissionPolicy_ADMISSION_POLICY_UNSPECIFIED: "ADMISSION_POLICY_UNSPECIFIED",
		fanoutv1.AdmissionPolicy_ADMISSION_POLICY_FORECAST:    "ADMISSION_POLICY_FORECAST",
		fanoutv1.AdmissionPolicy_ADMISSION_POLICY_GREEDY:      "ADMISSION_POLICY_GREEDY",
	})
	joinNames = enumNamesOf(map[fanoutv1.JoinPolicy]string{
		fanoutv1.JoinPolicy_JOIN_POLICY_UNSPECIFIED:   "JOIN_POLICY_UNSPECIFIED",
		fanoutv1.JoinPolicy_JOIN_POLICY_ALL_SETTLED:   "JOIN_POLICY_ALL_SETTLED",
		fanoutv1.JoinPolicy_JOIN_POLICY_FAIL_FAST:     "JOIN_POLICY_FAIL_FAST",
		fanoutv1.JoinPolicy_JOIN_POLICY_FIRST_SUCCESS: "JOIN_POLICY_FIRST_SUCCESS",
	})
	hedgeAttemptNames = enumNamesOf(map[fanoutv1.HedgeAttempt]string{
		fanoutv1.HedgeAttempt_HEDGE_ATTEMPT_UNSPECIFIED: "HEDGE_ATTEMPT_UNSPECIFIED",
		fanoutv1.HedgeAttempt_HEDGE_ATTEMPT_FIRST:       "HEDGE_ATTEMPT_FIRST",
		fanoutv1.HedgeAttempt_HEDGE_ATTEMPT_HEDGE:       "HEDGE_ATTEMPT_HEDGE",
	})
)

func (v runStateJSON) MarshalJSON() ([]byte, error)    { return stateNames.marshal(int32(v)) }
func (v *runStateJSON) UnmarshalJSON(b []byte) error   { return stateNames.unmarshal(b, (*int32)(v)) }
func (v taskStatusJSON) MarshalJSON() ([]byte, error)  { return statusNames.marshal(int32(v)) }
func (v *taskStatusJSON) UnmarshalJSON(b []byte) error { return statusNames.unmarshal(b, (*int32)(v)) }
func (v exhaustionJSON) MarshalJSON() ([]byte, error)  { return exhaustNames.marshal(int32(v)) }
func (v *exhaustionJSON) UnmarshalJSON(b []byte) error { return exhaustNames.unmarshal(b, (*int32)(v)) }
func (v admissionJSON) MarshalJSON() ([]byte, error)   { return admissionNames.marshal(int32(v)) }
func (v *admissionJSON) UnmarshalJSON(b []byte) error {
	return admissionNames.unmarshal(b, (*int32)(v))
}
func (v joinPolicyJSON) MarshalJSON() ([]byte, error)   { return joinNames.marshal(int32(v)) }
func (v *joinPolicyJSON) UnmarshalJSON(b []byte) error  { return joinNames.unmarshal(b, (*int32)(v)) }
func (v hedgeAttemptJSON) MarshalJSON() ([]byte, error) { return hedgeAttemptNames.marshal(int32(v)) }
func (v *hedgeAttemptJSON) UnmarshalJSON(b []byte) error {
	return hedgeAttemptNames.unmarshal(b, (*int32)(v))
}

// enumNames is one enum's table, both ways.
type enumNames struct {
	name   map[int32]string
	number map[string]int32
}

func enumNamesOf[E ~int32](names map[E]string) enumNames {
	t := enumNames{name: make(map[int32]string, len(names)), number: make(map[string]int32, len(names))}
	for n, name := range names {
		t.name[int32(n)], t.number[name] = name, int32(n)
	}
	return t
}

func (t enumNames) marshal(n int32) ([]byte, error) {
	if name, ok := t.name[n]; ok {
		return strconv.AppendQuote(nil, name), nil
	}
	return strconv.AppendInt(nil, int64(n), 10), nil
}

func (t enumNames) unmarshal(b []byte, n *int32) error {
	if string(b) == "null" {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var name string
		if err := json.Unmarshal(b, &name); err != nil {
			return err
		}
		*n = t.number[name] // 0 for a name this binary does not know
		return nil
	}
	v, err := strconv.ParseInt(string(b), 10, 32)
	if err != nil {
		return fmt.Errorf("%s is not an enum value", b)
	}
	*n = int32(v)
	return nil
}
