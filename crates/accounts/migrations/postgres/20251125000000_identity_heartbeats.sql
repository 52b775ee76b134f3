-- The client's own x-request-id, kept beside the server's id: clients reuse ids (retries,
-- constant ids), so it is neither unique nor a key.
ALTER TABLE usage_records ADD COLUMN client_request_id TEXT;
CREATE INDEX usage_records_client_request_id ON usage_records (client_request_id);

-- One row per running server process; `heartbeat_at_ms` is refreshed every few seconds.
-- Reservations whose owner has no fresh heartbeat belong to a dead process and are released.
CREATE TABLE instances (
    id              TEXT   NOT NULL PRIMARY KEY,
    started_at_ms   BIGINT NOT NULL,
    heartbeat_at_ms BIGINT NOT NULL
);
