package store

import (
	"strings"
	"testing"
)

// TestDurabilityProblems: each setting that can lose an acknowledged
// commit is named, and nothing else is (docs/operations.md#ha-postgresql).
func TestDurabilityProblems(t *testing.T) {
	durable := Durability{Fsync: "on", FullPageWrites: "on", SynchronousCommit: "on"}
	for _, tc := range []struct {
		name string
		edit func(*Durability)
		want string // a word of the one problem; "" for none
	}{
		{"single server, defaults", func(*Durability) {}, ""},
		{"sync standby", func(d *Durability) { d.Standbys, d.SynchronousStandbyNames = 1, "FIRST 1 (s1)" }, ""},
		{"remote_write with a sync standby", func(d *Durability) {
			d.Standbys, d.SynchronousStandbyNames, d.SynchronousCommit = 1, "ANY 1 (*)", "remote_write"
		}, ""},
		{"remote_apply", func(d *Durability) { d.SynchronousCommit = "remote_apply" }, ""},
		{"local on a single server", func(d *Durability) { d.SynchronousCommit = "local" }, ""},
		{"sync names set, standby down", func(d *Durability) { d.SynchronousStandbyNames = "s1" }, ""},
		{"fsync off", func(d *Durability) { d.Fsync = "off" }, "fsync = off"},
		{"full_page_writes off", func(d *Durability) { d.FullPageWrites = "off" }, "full_page_writes = off"},
		{"synchronous_commit off", func(d *Durability) { d.SynchronousCommit = "off" }, "synchronous_commit = off"},
		{"local with sync standbys", func(d *Durability) {
			d.Standbys, d.SynchronousStandbyNames, d.SynchronousCommit = 1, "s1", "local"
		}, "synchronous_commit = local"},
		{"async standby", func(d *Durability) { d.Standbys = 1 }, "synchronous_standby_names is empty with 1 standby"},
		{"async standby and fsync off", func(d *Durability) { d.Standbys, d.Fsync = 2, "off" }, "fsync = off"},
		{"a standby", func(d *Durability) { d.InRecovery = true }, "pg_is_in_recovery"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := durable
			tc.edit(&d)
			got := d.Problems(false)
			if tc.want != "" && tc.edit != nil && d.Standbys > 0 {
				// --allow-async-standbys waives that rule, and only it.
				waived := d.Problems(true)
				if strings.Contains(tc.want, "synchronous_standby_names") && len(waived) != 0 {
					t.Errorf("%s: with asynchronous standbys accepted, problems %q, want none", d.Summary(), waived)
				}
				if !strings.Contains(tc.want, "synchronous_standby_names") && (len(waived) != 1 || !strings.Contains(waived[0], tc.want)) {
					t.Errorf("%s: with asynchronous standbys accepted, problems %q, want one naming %q", d.Summary(), waived, tc.want)
				}
				if len(got) > 1 {
					got = got[:1] // the case names its first problem; the standby rule is the second
				}
			}
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("%s: problems %q, want none", d.Summary(), got)
			case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], tc.want)):
				t.Errorf("%s: problems %q, want one naming %q", d.Summary(), got, tc.want)
			}
		})
	}
}
