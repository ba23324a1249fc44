package store

import (
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Runs, tasks and events are stored as protojson in jsonb columns, so SQL
// can read them (spec->>'goal', outcome->'summary'->>'error'): with the
// proto field names, as the .proto files spell them; unknown fields (written
// by a newer binary) are skipped on read.
var (
	jsonbWrite = protojson.MarshalOptions{UseProtoNames: true}
	jsonbRead  = protojson.UnmarshalOptions{DiscardUnknown: true}
)

// toJSONB encodes m for a jsonb column; a nil message is {}.
func toJSONB(m proto.Message) ([]byte, error) {
	if m == nil || !m.ProtoReflect().IsValid() {
		return []byte("{}"), nil
	}
	return jsonbWrite.Marshal(m)
}

// fromJSONB decodes a jsonb column into m.
func fromJSONB(b []byte, m proto.Message) error {
	return jsonbRead.Unmarshal(b, m)
}
