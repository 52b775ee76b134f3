-- Which requests may reuse one another's cached prompt prefixes: 'tenant' (the key's tenant),
-- 'key' (this key alone) or 'shared' (every 'shared' key). Existing keys get 'tenant'.
ALTER TABLE api_keys ADD COLUMN cache_scope TEXT NOT NULL DEFAULT 'tenant';
