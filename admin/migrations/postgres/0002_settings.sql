-- Runtime settings edited through the admin API / CLI. One row per overridden key; a key
-- without a row takes the value from the gateway's configuration. Values are text (numbers
-- in decimal, enums in snake_case); updated_at is Unix milliseconds.

CREATE TABLE settings (
    key         TEXT    PRIMARY KEY,
    value       TEXT    NOT NULL,
    updated_at  BIGINT  NOT NULL
);
