-- The usage path's cost per record (issue 25): every request writes one usage record, and
-- every index of usage_records is one more b-tree insert per record. Two of them serve no
-- query on SQLite: every usage query filters by key and account as `($3 IS NULL OR key_id =
-- $3)`, which SQLite plans once, at prepare time, without the value, so no plan can search
-- (key_id, started_at_ms) or (account_id, started_at_ms); the only plans that touched them
-- were full scans that took usage_records_key_started for its order (the per-key spend and
-- the usage summary), slower than the range on usage_records_started they now use. Together
-- they were about 6,000 of the 29,000 instructions SQLite spends inserting a record
-- (benches/results). PostgreSQL keeps both: it plans with the values and searches them
-- (its migration 0023). Query plans: storage::sqlite::tests::usage_query_plans.

DROP INDEX IF EXISTS usage_records_key_started;
DROP INDEX IF EXISTS usage_records_account_started;
