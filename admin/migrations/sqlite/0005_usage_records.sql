-- Usage records (issue 12): per-record id (dedup of a durable-spool replay), the request's
-- reasoning effort and service tier, the transport, time to first token, failovers and the
-- failure class; hourly rollups per (hour, key, account, model), kept apart from the raw
-- records so each has its own retention. Times are Unix milliseconds.

ALTER TABLE usage_records ADD COLUMN record_id TEXT;
ALTER TABLE usage_records ADD COLUMN reasoning_effort TEXT;
ALTER TABLE usage_records ADD COLUMN service_tier TEXT;
ALTER TABLE usage_records ADD COLUMN transport TEXT;
ALTER TABLE usage_records ADD COLUMN ttft_ms INTEGER;
ALTER TABLE usage_records ADD COLUMN failovers INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage_records ADD COLUMN error_class TEXT;

-- NULL (records from before this migration) never conflicts.
CREATE UNIQUE INDEX usage_records_record_id ON usage_records (record_id);

-- account_id 0: no account served the request (a primary key cannot hold NULL).
CREATE TABLE usage_hourly (
    hour_ms           INTEGER NOT NULL,
    key_id            INTEGER NOT NULL,
    account_id        INTEGER NOT NULL,
    model             TEXT    NOT NULL,
    requests          INTEGER NOT NULL DEFAULT 0,
    errors            INTEGER NOT NULL DEFAULT 0,
    input_tokens      INTEGER NOT NULL DEFAULT 0,
    cached_tokens     INTEGER NOT NULL DEFAULT 0,
    output_tokens     INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens  INTEGER NOT NULL DEFAULT 0,
    failovers         INTEGER NOT NULL DEFAULT 0,
    latency_ms_sum    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (hour_ms, key_id, account_id, model)
);

INSERT INTO usage_hourly (hour_ms, key_id, account_id, model, requests, errors, input_tokens,
    cached_tokens, output_tokens, reasoning_tokens, failovers, latency_ms_sum)
SELECT (started_at_ms / 3600000) * 3600000, key_id, COALESCE(account_id, 0), model, COUNT(*),
    SUM(CASE WHEN status >= 400 OR error_code IS NOT NULL THEN 1 ELSE 0 END),
    SUM(input_tokens), SUM(cached_tokens), SUM(output_tokens), SUM(reasoning_tokens), 0,
    SUM(latency_ms)
FROM usage_records
GROUP BY (started_at_ms / 3600000) * 3600000, key_id, COALESCE(account_id, 0), model;
