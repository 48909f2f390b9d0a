package pgdedup

// PlantNaiveClaim gives s the claim that partitioning by day invites and
// that the boundary tests must catch: no per-key lock, and an insert that
// looks for the key in the partition of the clock's day only (the only one
// its primary key covers).
func PlantNaiveClaim(s *Store) {
	today := `processed_at >= date_trunc('day', $5::timestamptz AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'`
	t := s.q.table
	s.q.lockOne, s.q.lockMany = "", ""
	s.q.claimInsertOne = `INSERT INTO ` + t + ` (scope, key, payload_hash, processed_at, expires_at)
SELECT $1, $2, $3, $5::timestamptz, $5 + $4 * interval '1 microsecond'
WHERE NOT EXISTS (SELECT FROM ` + t + ` WHERE scope = $1 AND key = $2 AND ` + today + `)
RETURNING key`
	s.q.claimInsert = `INSERT INTO ` + t + ` (scope, key, payload_hash, processed_at, expires_at)
SELECT $1, u.k, u.h, $5::timestamptz, $5 + $4 * interval '1 microsecond'
FROM unnest($2::text[], $3::bytea[]) AS u(k, h)
WHERE NOT EXISTS (SELECT FROM ` + t + ` AS p WHERE p.scope = $1 AND p.key = u.k AND ` + today + `)
ORDER BY u.k
RETURNING key`
}
