package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// LiveKeyIDs returns the ids of the keys live as of the database's now(),
// at most limit of them (the newest first): an orchestrator knows them
// before their first call (auth.Authenticator's known ids), so that a key
// the database has is looked up in a lane a flood of made-up ids cannot
// fill.
func (k *Keys) LiveKeyIDs(ctx context.Context, limit int) ([]string, error) {
	ids, err := retry(ctx, k.log, "keys.live_ids", idempotent, func(ctx context.Context, _ try) ([]string, error) {
		rows, err := k.pool.Query(ctx, `SELECT key_id FROM api_key
			WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
			ORDER BY created_at DESC LIMIT $1`, limit)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[string])
	})
	if err != nil {
		return nil, fmt.Errorf("read the live key ids: %w", err)
	}
	return ids, nil
}
