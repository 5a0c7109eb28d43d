-- The usage path's cost per record (issue 25): SQLite dropped usage_records_key_started and
-- usage_records_account_started (its migration 0023: its plans never search them, and each
-- was a b-tree insert per record). PostgreSQL keeps both: it plans a usage query with its
-- values (custom plans), so `($3 IS NULL OR key_id = $3)` with a key becomes `key_id = $3`
-- and the key- and account-filtered usage reports search these indexes. Said here, where
-- the next reader of the schema looks.

COMMENT ON INDEX usage_records_key_started IS
    'key-filtered usage reports (PostgreSQL plans them with the key); not on SQLite (0023)';
COMMENT ON INDEX usage_records_account_started IS
    'account-filtered usage reports (PostgreSQL plans them with the account); not on SQLite (0023)';
