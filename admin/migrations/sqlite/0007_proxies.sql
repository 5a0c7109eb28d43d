-- Egress proxies (issue 14). `url` is the proxy URL without its password
-- (scheme://[user@]host:port, scheme http, socks5 or socks5h); the password is sealed like the
-- account tokens ("v2:" AEAD bound to the table, the column and the proxy's name), or '' when
-- there is none. A proxy in a named `pool` serves the accounts assigned to that pool.
-- `last_check_*` hold the last admin "test" result. Times are Unix milliseconds.

CREATE TABLE proxies (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    name              TEXT    NOT NULL UNIQUE,
    url               TEXT    NOT NULL,
    password_enc      TEXT    NOT NULL DEFAULT '',
    pool              TEXT,
    enabled           BOOLEAN NOT NULL DEFAULT TRUE,
    last_check_at     INTEGER,
    last_check_ok     BOOLEAN,
    last_check_ms     INTEGER,
    last_check_error  TEXT,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL
);

CREATE INDEX proxies_pool ON proxies (pool);

-- An account's egress: one proxy, or a pool (one of its enabled proxies, chosen per account
-- by rendezvous hashing). No row: direct.
CREATE TABLE account_proxies (
    account_id  INTEGER PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
    proxy_id    INTEGER REFERENCES proxies (id),
    pool        TEXT,
    updated_at  INTEGER NOT NULL,
    CHECK ((proxy_id IS NULL) <> (pool IS NULL))
);
