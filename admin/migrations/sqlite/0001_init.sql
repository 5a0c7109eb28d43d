-- codex-gateway schema (SQLite). Times: *_at and *_ms columns are Unix milliseconds, except
-- access_expires_at and *_reset_at, which are Unix seconds (as the JWT and the upstream send them).
-- Token columns hold "v1:" + base64(nonce || ChaCha20-Poly1305 ciphertext), or '' when absent.

CREATE TABLE accounts (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    chatgpt_account_id  TEXT    NOT NULL,
    user_id             TEXT    NOT NULL DEFAULT '',
    email               TEXT,
    plan_type           TEXT,
    status              TEXT    NOT NULL DEFAULT 'active',
    weight              INTEGER NOT NULL DEFAULT 1,
    max_concurrency     INTEGER NOT NULL DEFAULT 0,
    access_token_enc    TEXT    NOT NULL DEFAULT '',
    refresh_token_enc   TEXT    NOT NULL DEFAULT '',
    id_token_enc        TEXT    NOT NULL DEFAULT '',
    access_expires_at   INTEGER,
    last_refresh_at     INTEGER,
    cooldown_until_ms   INTEGER NOT NULL DEFAULT 0,
    cooldown_reason     TEXT,
    primary_used_pct    REAL,
    primary_reset_at    INTEGER,
    secondary_used_pct  REAL,
    secondary_reset_at  INTEGER,
    quota_updated_at    INTEGER,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    UNIQUE (chatgpt_account_id, user_id)
);

CREATE TABLE api_keys (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT    NOT NULL,
    key_hash    TEXT    NOT NULL UNIQUE,
    key_prefix  TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);

CREATE INDEX api_keys_name ON api_keys (name);

CREATE TABLE usage_records (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    key_id            INTEGER NOT NULL,
    account_id        INTEGER,
    route             TEXT    NOT NULL,
    model             TEXT    NOT NULL,
    status            INTEGER NOT NULL,
    stream            INTEGER NOT NULL,
    input_tokens      INTEGER NOT NULL DEFAULT 0,
    cached_tokens     INTEGER NOT NULL DEFAULT 0,
    output_tokens     INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens  INTEGER NOT NULL DEFAULT 0,
    ttfb_ms           INTEGER,
    latency_ms        INTEGER NOT NULL,
    error_code        TEXT,
    started_at_ms     INTEGER NOT NULL
);

CREATE INDEX usage_records_started ON usage_records (started_at_ms);
CREATE INDEX usage_records_key_started ON usage_records (key_id, started_at_ms);
CREATE INDEX usage_records_account_started ON usage_records (account_id, started_at_ms);
