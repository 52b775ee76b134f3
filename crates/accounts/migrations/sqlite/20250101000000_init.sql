-- API keys: only the SHA-256 hex of the secret and a short display prefix are stored.
CREATE TABLE api_keys (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT    NOT NULL,
    prefix      TEXT    NOT NULL,
    secret_hash TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);

CREATE UNIQUE INDEX api_keys_secret_hash ON api_keys (secret_hash);
CREATE INDEX api_keys_name ON api_keys (name);
CREATE INDEX api_keys_prefix ON api_keys (prefix);

-- One row per request; request_id makes recording exactly-once.
CREATE TABLE usage_records (
    request_id        TEXT    NOT NULL PRIMARY KEY,
    key_id            INTEGER NOT NULL REFERENCES api_keys (id),
    model             TEXT    NOT NULL,
    prompt_tokens     INTEGER NOT NULL,
    cached_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    outcome           TEXT    NOT NULL,
    started_at_ms     INTEGER NOT NULL,
    finished_at_ms    INTEGER NOT NULL
);

CREATE INDEX usage_records_key_model ON usage_records (key_id, model);
