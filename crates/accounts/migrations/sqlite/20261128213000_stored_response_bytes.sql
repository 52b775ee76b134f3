-- What each stored response takes, in bytes (its items and its Response object): the per-key
-- quota and the conversation bound add these up without reading the rows' text.
ALTER TABLE stored_responses ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
-- Rows kept before this column: their length in characters, which is close enough.
UPDATE stored_responses SET bytes = LENGTH(items) + LENGTH(response);
-- The quota drops a key's oldest responses first.
CREATE INDEX stored_responses_key_age ON stored_responses (key_id, created_at_ms);
