-- Weighted fair sharing of the engine: a key's share among its tenant's keys, and a tenant's
-- share among tenants (a tenant without a row weighs 1). Both are at least 1.
ALTER TABLE api_keys ADD COLUMN weight BIGINT NOT NULL DEFAULT 1;
CREATE TABLE tenants (
    name   TEXT PRIMARY KEY,
    weight BIGINT NOT NULL DEFAULT 1
);
