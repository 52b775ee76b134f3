-- Files (OpenAI's Files API) and batches (its Batch API). A file belongs to the key that
-- uploaded it (a batch's output files to the batch's key); every read names the key. Content is
-- kept in the database so that every replica sharing it reads the same files.
CREATE TABLE files (
    id         TEXT    NOT NULL PRIMARY KEY,
    key_id     BIGINT  NOT NULL REFERENCES api_keys (id),
    purpose    TEXT    NOT NULL,
    filename   TEXT    NOT NULL,
    bytes      BIGINT  NOT NULL,
    -- Seconds since the epoch, as the API reports it.
    created_at BIGINT  NOT NULL,
    content    TEXT    NOT NULL
);
CREATE INDEX files_key ON files (key_id, created_at);

-- One row per batch; its lines are in `batch_lines`, its spend in `usage_records.batch_id`.
CREATE TABLE batches (
    id                TEXT    NOT NULL PRIMARY KEY,
    key_id            BIGINT  NOT NULL REFERENCES api_keys (id),
    endpoint          TEXT    NOT NULL,
    input_file_id     TEXT    NOT NULL,
    completion_window TEXT    NOT NULL,
    -- validating, failed, in_progress, finalizing, completed, expired, cancelling, cancelled.
    status            TEXT    NOT NULL,
    -- The caller's metadata (a JSON object) and the validation errors (a JSON array), if any.
    metadata          TEXT,
    errors            TEXT,
    output_file_id    TEXT,
    error_file_id     TEXT,
    created_at        BIGINT  NOT NULL,
    in_progress_at    BIGINT,
    expires_at        BIGINT  NOT NULL,
    finalizing_at     BIGINT,
    completed_at      BIGINT,
    failed_at         BIGINT,
    expired_at        BIGINT,
    cancelling_at     BIGINT,
    cancelled_at      BIGINT
);
CREATE INDEX batches_key ON batches (key_id, created_at);
CREATE INDEX batches_status ON batches (status);

-- A batch's requests, one per input line. `state`: pending (not started), running (claimed by
-- the server `claimed_by`, whose heartbeat keeps the claim), done (its answer in `status_code`
-- and `response`). `request_id` is the line's id in the output and in the usage ledger, where
-- its primary key books a line run twice (a server killed mid-line) once.
CREATE TABLE batch_lines (
    batch_id    TEXT    NOT NULL REFERENCES batches (id),
    line        BIGINT  NOT NULL,
    custom_id   TEXT    NOT NULL,
    request_id  TEXT    NOT NULL,
    body        TEXT    NOT NULL,
    state       TEXT    NOT NULL,
    claimed_by  TEXT,
    status_code BIGINT,
    response    TEXT,
    PRIMARY KEY (batch_id, line)
);
CREATE INDEX batch_lines_state ON batch_lines (state, batch_id, line);

ALTER TABLE usage_records ADD COLUMN batch_id TEXT;
CREATE INDEX usage_records_batch ON usage_records (batch_id);
