-- Admin credentials (issue 13). The admin password is stored only as an Argon2id PHC string;
-- sessions and admin API tokens only as hex SHA-256 of the random secret the browser / script
-- holds. Times are Unix milliseconds.

CREATE TABLE admin_password (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    password_hash  TEXT    NOT NULL,
    updated_at     INTEGER NOT NULL
);

CREATE TABLE admin_sessions (
    id_hash     TEXT    PRIMARY KEY,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);

CREATE TABLE admin_tokens (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    name          TEXT    NOT NULL,
    token_hash    TEXT    NOT NULL UNIQUE,
    token_prefix  TEXT    NOT NULL,
    created_at    INTEGER NOT NULL,
    last_used_at  INTEGER,
    revoked_at    INTEGER
);

-- The usage page's recent failures read the newest failed records.
CREATE INDEX usage_records_failed ON usage_records (started_at_ms) WHERE status >= 400 OR error_code IS NOT NULL;
