-- Tenants, expiry, allowed models and budgets on keys; cost and tenant in the ledger;
-- per-period spend counters and the reservations held by requests in flight.
ALTER TABLE api_keys ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE api_keys ADD COLUMN expires_at INTEGER;
-- JSON array of model ids; NULL means every model.
ALTER TABLE api_keys ADD COLUMN allowed_models TEXT;
ALTER TABLE api_keys ADD COLUMN budget_tokens INTEGER;
-- Money is kept in nano-dollars (USD × 1e9): integers, no rounding drift.
ALTER TABLE api_keys ADD COLUMN budget_nanos INTEGER;
ALTER TABLE api_keys ADD COLUMN budget_period TEXT NOT NULL DEFAULT 'total';

ALTER TABLE usage_records ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE usage_records ADD COLUMN cost_nanos INTEGER NOT NULL DEFAULT 0;
CREATE INDEX usage_records_started ON usage_records (started_at_ms);

-- Spend per key and budget period ('total' or 'YYYY-MM'): settled amounts plus the amounts
-- reserved by requests still running. Admission is one conditional UPDATE on this row.
CREATE TABLE key_spend (
    key_id          INTEGER NOT NULL REFERENCES api_keys (id),
    period          TEXT    NOT NULL,
    spent_tokens    INTEGER NOT NULL DEFAULT 0,
    spent_nanos     INTEGER NOT NULL DEFAULT 0,
    reserved_tokens INTEGER NOT NULL DEFAULT 0,
    reserved_nanos  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, period)
);

-- One row per admitted request until it is settled; `owner` names the server process that
-- holds it, so a restart can release what a crash left behind.
CREATE TABLE reservations (
    request_id    TEXT    NOT NULL PRIMARY KEY,
    key_id        INTEGER NOT NULL REFERENCES api_keys (id),
    period        TEXT    NOT NULL,
    tokens        INTEGER NOT NULL,
    nanos         INTEGER NOT NULL,
    owner         TEXT    NOT NULL,
    created_at_ms INTEGER NOT NULL
);
CREATE INDEX reservations_owner ON reservations (owner);

-- Requests and tokens per key per minute, for rate limits shared through the database.
CREATE TABLE rate_windows (
    key_id    INTEGER NOT NULL REFERENCES api_keys (id),
    minute    INTEGER NOT NULL,
    requests  INTEGER NOT NULL DEFAULT 0,
    tokens    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, minute)
);
