-- The completion tokens a reasoning model spent thinking. They are also counted in
-- completion_tokens (and billed as such); this column reports them apart. Older rows get 0.
ALTER TABLE usage_records ADD COLUMN reasoning_tokens BIGINT NOT NULL DEFAULT 0;
