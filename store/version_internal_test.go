package store

import (
	"strings"
	"testing"
)

// TestMigrateRefusesServersBefore15: a server older than PostgreSQL 15 is
// refused with the version found and the minimum; 15 and later pass.
func TestMigrateRefusesServersBefore15(t *testing.T) {
	t.Parallel()
	err := serverVersionError(140011, "14.11 (Debian 14.11-1)")
	if err == nil || !strings.Contains(err.Error(), "PostgreSQL 14.11 (Debian 14.11-1) found") ||
		!strings.Contains(err.Error(), "PostgreSQL 15 or later") || !strings.Contains(err.Error(), "security_invoker") {
		t.Errorf("PostgreSQL 14: err = %v; want it to name 14.11, the minimum 15 and why", err)
	}
	for _, ok := range []int{150000, 150018, 170002} {
		if err := serverVersionError(ok, "x"); err != nil {
			t.Errorf("server_version_num %d: %v, want accepted", ok, err)
		}
	}
}
