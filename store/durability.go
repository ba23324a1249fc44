package store

import (
	"context"
	"fmt"
	"strings"
)

// Durability is what a node's own session sees of the settings that decide
// whether a commit PostgreSQL acknowledged survives a crash of its server
// or a failover to a standby (docs/operations.md#ha-postgresql). A grant
// the ledger acknowledged and then lost is tokens a worker spends that no
// account records: the ledger stays conserved on paper and is wrong in
// fact.
type Durability struct {
	// Version is server_version.
	Version string
	// Fsync, FullPageWrites: off can lose or tear committed pages on a
	// crash of the server's machine.
	Fsync, FullPageWrites string
	// SynchronousCommit is this session's value (a role's or database's
	// setting overrides the server's, so it is read here, on the node's
	// own login): off acknowledges a commit before its WAL is flushed;
	// local before any standby has it.
	SynchronousCommit string
	// SynchronousStandbyNames is the primary's list of synchronous
	// standbys; empty: every standby is asynchronous.
	SynchronousStandbyNames string
	// InRecovery: the session is on a standby (read-only).
	InRecovery bool
	// Standbys is how many physical standbys stream from this server now:
	// pg_stat_replication's rows (every role may count them) whose WAL
	// sender serves no database (a logical replication or CDC consumer
	// does) and is not taking a base backup.
	Standbys int
	// SyncStandbys is how many of them are synchronous now, or -1 when
	// the login may not see their state (it needs pg_monitor or
	// pg_read_all_stats).
	SyncStandbys int
}

// ReadDurability reads the durability settings as the pool's login sees
// them.
func ReadDurability(ctx context.Context, pool *Pool) (Durability, error) {
	var d Durability
	var visible bool
	err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
		current_setting('full_page_writes'), current_setting('synchronous_commit'),
		current_setting('synchronous_standby_names'), pg_is_in_recovery(),
		(SELECT count(*) FROM pg_stat_replication r JOIN pg_stat_activity a USING (pid)
			WHERE a.datid IS NULL AND r.state IS DISTINCT FROM 'backup'),
		(SELECT count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')) FROM pg_stat_replication),
		(SELECT coalesce(bool_and(state IS NOT NULL), true) FROM pg_stat_replication)`).Scan(
		&d.Version, &d.Fsync, &d.FullPageWrites, &d.SynchronousCommit, &d.SynchronousStandbyNames,
		&d.InRecovery, &d.Standbys, &d.SyncStandbys, &visible)
	if err != nil {
		return Durability{}, fmt.Errorf("read the database's durability settings: %w", err)
	}
	if !visible {
		d.SyncStandbys = -1
	}
	return d, nil
}

// Problems lists, one line each, every setting with which a commit the
// server acknowledged (a grant, a settle) can be lost: each names the
// setting, its value, what it risks and what to set. None: durable on
// this server and on any synchronous standby it fails over to.
// asyncStandbys accepts standbys that are asynchronous (read replicas
// never promoted, the failover handled synchronously below PostgreSQL).
func (d Durability) Problems(asyncStandbys bool) []string {
	var out []string
	if d.InRecovery {
		out = append(out, "pg_is_in_recovery() = true: this is a standby, which cannot write; "+
			"connect to the primary (a multi-host URL with target_session_attrs=read-write)")
	}
	if d.Fsync != "on" {
		out = append(out, fmt.Sprintf("fsync = %s: a crash of the server's machine can lose or corrupt committed grants; set fsync = on", d.Fsync))
	}
	if d.FullPageWrites != "on" {
		out = append(out, fmt.Sprintf("full_page_writes = %s: a crash mid-write can tear a page of the ledger; set full_page_writes = on", d.FullPageWrites))
	}
	switch sc := d.SynchronousCommit; {
	case sc == "off":
		out = append(out, "synchronous_commit = off (as this login sees it): a commit is acknowledged before its WAL is flushed, "+
			"so a crash loses the last grants a worker was told of; set synchronous_commit = on (on the server, and on no role or database below it)")
	case sc == "local" && (d.SynchronousStandbyNames != "" || d.Standbys > 0):
		out = append(out, "synchronous_commit = local (as this login sees it): a commit is acknowledged before any standby has it, "+
			"so a failover loses the last grants; set synchronous_commit = on (or remote_apply)")
	}
	if d.Standbys > 0 && strings.TrimSpace(d.SynchronousStandbyNames) == "" && !asyncStandbys {
		out = append(out, fmt.Sprintf("synchronous_standby_names is empty with %d standby(s) streaming: replication is asynchronous, "+
			"so a failover to a standby loses the grants it had not received yet; name the standbys "+
			"(e.g. synchronous_standby_names = 'ANY 1 (*)'; CloudNativePG: spec.postgresql.synchronous with dataDurability: required), "+
			"or, if they are read replicas that are never promoted, pass --allow-async-standbys", d.Standbys))
	}
	return out
}

// Summary is the settings on one line, for a log.
func (d Durability) Summary() string {
	sync := "unknown (needs pg_monitor)"
	if d.SyncStandbys >= 0 {
		sync = fmt.Sprint(d.SyncStandbys)
	}
	return fmt.Sprintf("PostgreSQL %s: fsync=%s full_page_writes=%s synchronous_commit=%s synchronous_standby_names=%q "+
		"standbys=%d synchronous=%s in_recovery=%v", d.Version, d.Fsync, d.FullPageWrites, d.SynchronousCommit,
		d.SynchronousStandbyNames, d.Standbys, sync, d.InRecovery)
}

// Standby is one row of pg_stat_replication as the login sees it: without
// pg_monitor (or pg_read_all_stats) every field but the name is empty.
type Standby struct {
	Name, Client, State, SyncState string
	// ReplayLag is pg_stat_replication.replay_lag ("" when unknown).
	ReplayLag string
}

// Standbys lists the standbys streaming from the pool's server now.
func Standbys(ctx context.Context, pool *Pool) ([]Standby, error) {
	rows, err := pool.Query(ctx, `SELECT coalesce(application_name, ''), coalesce(host(client_addr), ''),
		coalesce(state, ''), coalesce(sync_state, ''), coalesce(replay_lag::text, '')
		FROM pg_stat_replication ORDER BY application_name`)
	if err != nil {
		return nil, fmt.Errorf("read pg_stat_replication: %w", err)
	}
	defer rows.Close()
	var out []Standby
	for rows.Next() {
		var s Standby
		if err := rows.Scan(&s.Name, &s.Client, &s.State, &s.SyncState, &s.ReplayLag); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}
