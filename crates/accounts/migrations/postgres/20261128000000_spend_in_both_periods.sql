-- Settlements are booked in both kinds of budget period (the lifetime 'total' and the month the
-- request started in), so changing a key's budget_period keeps what it spent. Spend booked before
-- is recomputed from the ledger, which holds every settled request.
INSERT INTO key_spend (key_id, period)
SELECT DISTINCT key_id, 'total' FROM usage_records
ON CONFLICT (key_id, period) DO NOTHING;
INSERT INTO key_spend (key_id, period)
SELECT DISTINCT key_id, to_char(to_timestamp(started_at_ms / 1000.0) AT TIME ZONE 'UTC', 'YYYY-MM') FROM usage_records
ON CONFLICT (key_id, period) DO NOTHING;
UPDATE key_spend SET
    spent_tokens = (SELECT COALESCE(SUM(u.prompt_tokens + u.completion_tokens), 0) FROM usage_records u
                    WHERE u.key_id = key_spend.key_id
                      AND (key_spend.period = 'total'
                           OR to_char(to_timestamp(u.started_at_ms / 1000.0) AT TIME ZONE 'UTC', 'YYYY-MM') = key_spend.period)),
    spent_nanos = (SELECT COALESCE(SUM(u.cost_nanos), 0) FROM usage_records u
                   WHERE u.key_id = key_spend.key_id
                     AND (key_spend.period = 'total'
                          OR to_char(to_timestamp(u.started_at_ms / 1000.0) AT TIME ZONE 'UTC', 'YYYY-MM') = key_spend.period));
