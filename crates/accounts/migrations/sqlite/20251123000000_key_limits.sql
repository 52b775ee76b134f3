-- Per-key rate limits: requests and tokens per minute; NULL means unlimited.
ALTER TABLE api_keys ADD COLUMN rpm_limit INTEGER;
ALTER TABLE api_keys ADD COLUMN tpm_limit INTEGER;
