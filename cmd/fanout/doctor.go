package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/fanout/fanout/store"
)

const doctorUsage = `
Check a database for fanout: the settings that decide whether a grant it acknowledged
survives a crash or a failover (fsync, full_page_writes, synchronous_commit as this login
sees it, synchronous_standby_names), the standbys streaming from it, and what this login
may do. Prints a verdict; exits 1 when a grant can be lost (docs/operations.md#ha-postgresql).
Run it with each process's own login: a role's setting can override the server's.

Usage:
  fanout doctor --database-url URL

Example:
  fanout doctor --database-url postgres://fanout_worker_1@db-rw:5432/fanout
`

// errUnsafe is doctor's verdict "a grant can be lost": exit status 1, the
// report already printed.
var errUnsafe = errors.New("the database can lose a grant it acknowledged")

func cmdDoctor(ctx context.Context, env *Env, args []string) error {
	f := newFlags("doctor", doctorUsage, env.Stderr)
	var url string
	f.secretVar(&url, "database-url", "PostgreSQL URL (a node's login, to see what it sees)")
	f.alsoEnv("database-url", "DATABASE_URL")
	if err := parseFlags(f, args, env); err != nil {
		return err
	}
	if url == "" {
		return fmt.Errorf("--database-url or --database-url-file (or DATABASE_URL, FANOUT_DATABASE_URL_FILE) is required")
	}
	pool, err := store.Open(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	d, err := store.ReadDurability(ctx, pool)
	if err != nil {
		return err
	}
	standbys, err := store.Standbys(ctx, pool)
	if err != nil {
		return err
	}
	var user string
	if err := pool.QueryRow(ctx, `SELECT current_user`).Scan(&user); err != nil {
		return err
	}
	w := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "server\tPostgreSQL %s, login %s\n", d.Version, user)
	fmt.Fprintf(w, "fsync\t%s\n", d.Fsync)
	fmt.Fprintf(w, "full_page_writes\t%s\n", d.FullPageWrites)
	fmt.Fprintf(w, "synchronous_commit\t%s (as this login sees it)\n", d.SynchronousCommit)
	fmt.Fprintf(w, "synchronous_standby_names\t%q\n", d.SynchronousStandbyNames)
	fmt.Fprintf(w, "in recovery\t%v\n", d.InRecovery)
	fmt.Fprintf(w, "standbys\t%d streaming\n", len(standbys))
	for _, s := range standbys {
		if s.State == "" {
			fmt.Fprintf(w, "  %s\t(state hidden: the login needs pg_monitor to see it)\n", s.Name)
			continue
		}
		fmt.Fprintf(w, "  %s\t%s from %s, %s, replay lag %s\n", s.Name, s.State, s.Client, s.SyncState, cmp.Or(s.ReplayLag, "0"))
	}
	var roles []string
	for _, g := range []string{"fanout_app", "fanout_worker", "fanout_admin", "fanout_auditor"} {
		in, err := store.InGroup(ctx, pool, g)
		if err != nil {
			return err
		}
		if in {
			roles = append(roles, g)
		}
	}
	owner, err := store.OwnsSchema(ctx, pool)
	if err != nil {
		return err
	}
	role := strings.Join(roles, ", ")
	switch {
	case owner:
		role = "the schema's owner (or a superuser): for fanout migrate only, never a node's login"
	case role == "":
		role = "in no fanout group (a node needs fanout_app or fanout_worker)"
	}
	fmt.Fprintf(w, "roles\t%s\n", role)
	if err := w.Flush(); err != nil {
		return err
	}
	problems := d.Problems(false)
	if len(problems) == 0 {
		fmt.Fprintln(env.Stdout, "verdict: durable: a grant this database acknowledges survives a crash of its server"+
			map[bool]string{true: " and a failover to a synchronous standby", false: ""}[d.SynchronousStandbyNames != ""])
		if d.SynchronousStandbyNames != "" && d.SyncStandbys == 0 {
			fmt.Fprintln(env.Stdout, "note: no synchronous standby is connected now: every commit waits until one is")
		}
		return nil
	}
	fmt.Fprintln(env.Stdout, "verdict: UNSAFE: a grant this database acknowledged can be lost:")
	for _, p := range problems {
		fmt.Fprintf(env.Stdout, "  - %s\n", p)
	}
	return errUnsafe
}
