//go:build !race

package node_test

// raceEnabled: the tests are built with -race.
const raceEnabled = false
