-- Scale-out (issue 12): the fencing token of the last refresh that stored tokens (a refresh
-- whose Redis lease was lost stores nothing over a newer holder's tokens: the token UPDATE
-- requires its fence to be at least this one), and the cost of each hourly usage rollup.

ALTER TABLE accounts ADD COLUMN refresh_fence INTEGER NOT NULL DEFAULT 0;

ALTER TABLE usage_hourly ADD COLUMN cost_micros INTEGER NOT NULL DEFAULT 0;

-- Rollups of hours whose raw records are still kept get their cost back.
UPDATE usage_hourly SET cost_micros = COALESCE((
    SELECT SUM(r.cost_micros) FROM usage_records r
    WHERE r.started_at_ms >= usage_hourly.hour_ms
      AND r.started_at_ms < usage_hourly.hour_ms + 3600000
      AND r.key_id = usage_hourly.key_id
      AND COALESCE(r.account_id, 0) = usage_hourly.account_id
      AND r.model = usage_hourly.model), 0);
