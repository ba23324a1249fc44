// Package migrations holds fanout's schema as embedded, numbered SQL files:
// NNNN_name.up.sql applies a version, NNNN_name.down.sql reverts it.
package migrations

import "embed"

// FS holds every migration file.
//
//go:embed *.sql
var FS embed.FS
