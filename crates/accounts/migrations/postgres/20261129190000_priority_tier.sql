-- Whether the key's requests may run in service_tier "priority" (1) or get "default" when they
-- ask for it (0, as every key before this column).
ALTER TABLE api_keys ADD COLUMN priority_tier BIGINT NOT NULL DEFAULT 0;
