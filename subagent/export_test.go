package subagent

import "time"

// SetLedgerTry sets how long one try of a reserve or a settle may take,
// until the test ends.
func SetLedgerTry(t interface{ Cleanup(func()) }, d time.Duration) {
	old := ledgerTry
	ledgerTry = d
	t.Cleanup(func() { ledgerTry = old })
}
