-- The service tier each request ran in ('default', 'flex' or 'priority'), so spend can be
-- reported by tier. Rows written before the column ran in 'default'.
ALTER TABLE usage_records ADD COLUMN service_tier TEXT NOT NULL DEFAULT 'default';
