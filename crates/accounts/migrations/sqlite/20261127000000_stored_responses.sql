-- Responses kept for `store: true` (the Responses API): readable, continuable and deletable by
-- the key that made them only, until `expires_at_ms`; deleted when the key is revoked.
CREATE TABLE stored_responses (
    id            TEXT    NOT NULL PRIMARY KEY,
    key_id        INTEGER NOT NULL REFERENCES api_keys (id),
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    -- The response this one continued (`previous_response_id`), if any: the conversation is the
    -- chain's items, oldest first.
    previous_id   TEXT,
    -- This turn's input items and the response's output items, as Responses input items (JSON).
    items         TEXT    NOT NULL,
    -- The Response object (JSON).
    response      TEXT    NOT NULL
);
CREATE INDEX stored_responses_key ON stored_responses (key_id);
CREATE INDEX stored_responses_expiry ON stored_responses (expires_at_ms);
