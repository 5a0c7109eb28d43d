-- Per-key limits (issue 12 "keys and limits"). NULL means "no limit". Times are Unix ms; costs
-- are micro-USD. allowed_models is a JSON array of model slugs ('' or NULL: every model).
-- account_group on a key and on an account: a key uses only accounts of its group; NULL is the
-- shared pool.
ALTER TABLE api_keys ADD COLUMN rpm_limit BIGINT;
ALTER TABLE api_keys ADD COLUMN max_concurrency BIGINT;
ALTER TABLE api_keys ADD COLUMN tokens_per_day BIGINT;
ALTER TABLE api_keys ADD COLUMN tokens_per_month BIGINT;
ALTER TABLE api_keys ADD COLUMN cost_per_day_micros BIGINT;
ALTER TABLE api_keys ADD COLUMN cost_per_month_micros BIGINT;
ALTER TABLE api_keys ADD COLUMN allowed_models TEXT;
ALTER TABLE api_keys ADD COLUMN account_group TEXT;
ALTER TABLE api_keys ADD COLUMN expires_at BIGINT;
ALTER TABLE api_keys ADD COLUMN enabled BOOLEAN NOT NULL DEFAULT TRUE;
ALTER TABLE api_keys ADD COLUMN last_used_at BIGINT;
ALTER TABLE api_keys ADD COLUMN updated_at BIGINT;

ALTER TABLE accounts ADD COLUMN account_group TEXT;

-- The cost of each request at the configured prices, computed once by the data plane.
ALTER TABLE usage_records ADD COLUMN cost_micros BIGINT NOT NULL DEFAULT 0;
