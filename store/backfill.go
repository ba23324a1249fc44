package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// The Go half of migration 6 (see dataSteps): the rows of run, task and
// run_event that were stored as proto bytes are converted to protojson
// (toJSONB) after 0006 adds the jsonb columns, and back to proto bytes
// before 0006 is reverted. SQL cannot decode protobuf; Go can.

// backfillBatch is how many rows one transaction converts.
const backfillBatch = 500

// convertedTable is a table whose proto-encoded bytea columns 0006 gives a
// jsonb twin.
type convertedTable struct {
	name string
	key  []string // the primary key: batches walk it in order
	cols []convertedColumn
}

type convertedColumn struct {
	bytea, jsonb string
	msg          func() proto.Message
}

var convertedTables = []convertedTable{
	{name: "run", key: []string{"run_id"}, cols: []convertedColumn{
		{bytea: "spec", jsonb: "spec_json", msg: func() proto.Message { return &fanoutv1.RunSpec{} }},
		{bytea: "result", jsonb: "result_json", msg: func() proto.Message { return &fanoutv1.JoinedResult{} }},
	}},
	{name: "task", key: []string{"run_id", "task_id"}, cols: []convertedColumn{
		{bytea: "outcome", jsonb: "outcome_json", msg: func() proto.Message { return &fanoutv1.TaskOutcome{} }},
	}},
	{name: "run_event", key: []string{"run_id", "sequence"}, cols: []convertedColumn{
		{bytea: "event", jsonb: "event_json", msg: func() proto.Message { return &fanoutv1.RunEvent{} }},
	}},
}

// protoMarshal encodes deterministically, as the bytea columns were written.
var protoMarshal = proto.MarshalOptions{Deterministic: true}

// runsToJSONB fills each jsonb column that 0006 added from its bytea twin,
// wherever the jsonb one is still NULL.
func runsToJSONB(ctx context.Context, conn *pgx.Conn) error {
	return convertRuns(ctx, conn, true)
}

// runsToProto fills each bytea column from its jsonb twin wherever the bytea
// one is NULL (rows written at version 7), so that 0006 can be reverted.
func runsToProto(ctx context.Context, conn *pgx.Conn) error {
	return convertRuns(ctx, conn, false)
}

func convertRuns(ctx context.Context, conn *pgx.Conn, toJSON bool) error {
	for _, t := range convertedTables {
		if err := t.convert(ctx, conn, toJSON); err != nil {
			return err
		}
	}
	return nil
}

// convert converts the table in batches of backfillBatch rows, by primary
// key, each batch its own transaction. Only rows with a value to convert
// are touched and a converted value never overwrites one that is there, so
// it is idempotent, and a conversion cut off midway resumes where it was.
func (t convertedTable) convert(ctx context.Context, conn *pgx.Conn, toJSON bool) error {
	var after []any // the last key converted
	for {
		n, last, err := t.convertBatch(ctx, conn, toJSON, after)
		if err != nil {
			dir := "jsonb"
			if !toJSON {
				dir = "proto bytes"
			}
			return fmt.Errorf("convert %s to %s: %w", t.name, dir, err)
		}
		if n < backfillBatch {
			return nil
		}
		after = last
	}
}

func (t convertedTable) convertBatch(ctx context.Context, conn *pgx.Conn, toJSON bool, after []any) (n int, last []any, err error) {
	key := strings.Join(t.key, ", ")
	var src, dst, todo []string
	for _, c := range t.cols {
		from, to, read := c.bytea, c.jsonb, c.bytea
		if !toJSON {
			from, to, read = c.jsonb, c.bytea, c.jsonb+"::text"
		}
		src, dst = append(src, read), append(dst, to)
		todo = append(todo, fmt.Sprintf("(%s IS NOT NULL AND %s IS NULL)", from, to))
	}
	where := "(" + strings.Join(todo, " OR ") + ")"
	if after != nil {
		where += fmt.Sprintf(" AND (%s) > (%s)", key, params(1, len(t.key)))
	}
	sel := fmt.Sprintf("SELECT %s, %s FROM %s WHERE %s ORDER BY %s LIMIT %d FOR UPDATE",
		key, strings.Join(src, ", "), t.name, where, key, backfillBatch)
	set := make([]string, len(dst))
	for i, d := range dst {
		set[i] = fmt.Sprintf("%s = coalesce($%d, %s)", d, len(t.key)+i+1, d)
	}
	match := make([]string, len(t.key))
	for i, k := range t.key {
		match[i] = fmt.Sprintf("%s = $%d", k, i+1)
	}
	upd := fmt.Sprintf("UPDATE %s SET %s WHERE %s", t.name, strings.Join(set, ", "), strings.Join(match, " AND "))

	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sel, after...)
		if err != nil {
			return err
		}
		var updates [][]any
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				rows.Close()
				return err
			}
			args := vals[:len(t.key)]
			for i, c := range t.cols {
				v, err := convertValue(vals[len(t.key)+i], c.msg(), toJSON)
				if err != nil {
					rows.Close()
					return fmt.Errorf("%s of %s %v: %w", c.bytea, t.name, args, err)
				}
				args = append(args, v)
			}
			updates = append(updates, args)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		n = len(updates)
		if n == 0 {
			return nil
		}
		last = updates[n-1][:len(t.key)]
		b := &pgx.Batch{}
		for _, args := range updates {
			b.Queue(upd, args...)
		}
		return tx.SendBatch(ctx, b).Close()
	})
	return n, last, err
}

// convertValue converts one column value read by rows.Values: nil stays
// nil (the UPDATE's coalesce keeps the target as it is), proto bytes become
// protojson and protojson becomes proto bytes.
func convertValue(v any, msg proto.Message, toJSON bool) (any, error) {
	if v == nil {
		return nil, nil
	}
	if toJSON {
		b, ok := v.([]byte)
		if !ok {
			return nil, fmt.Errorf("read %T, want bytea", v)
		}
		if err := proto.Unmarshal(b, msg); err != nil {
			return nil, fmt.Errorf("decode proto: %w", err)
		}
		return toJSONB(msg)
	}
	js, ok := v.(string)
	if !ok {
		return nil, fmt.Errorf("read %T, want jsonb as text", v)
	}
	if err := fromJSONB([]byte(js), msg); err != nil {
		return nil, fmt.Errorf("decode protojson: %w", err)
	}
	b, err := protoMarshal.Marshal(msg)
	if b == nil {
		b = []byte{} // an empty message is empty bytes, not NULL
	}
	return b, err
}

// params is "$from, ..., $(from+n-1)".
func params(from, n int) string {
	ps := make([]string, n)
	for i := range ps {
		ps[i] = fmt.Sprintf("$%d", from+i)
	}
	return strings.Join(ps, ", ")
}
