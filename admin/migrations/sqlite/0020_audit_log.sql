-- Audit log of admin actions (issue 27): who (`actor`: `session`, `token:<name>#<id>`,
-- `static_token`, `cli`, `auto-clean`, `auth-dir`), from where (`source`: the client IP of an
-- API call), when (`at_ms`, Unix milliseconds), what (`action` such as `accounts.disable`,
-- the object's type and id) and how it ended (`status`: the HTTP status of an API call, 0 for
-- internal actors). `details`, `before_json` and `after_json` are JSON text with every secret
-- redacted before it is written (admin::audit::redact); before/after hold only the fields
-- that changed.

CREATE TABLE audit_log (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms        BIGINT  NOT NULL,
    actor        TEXT    NOT NULL,
    source       TEXT,
    action       TEXT    NOT NULL,
    object_type  TEXT,
    object_id    TEXT,
    status       BIGINT  NOT NULL DEFAULT 0,
    details      TEXT,
    before_json  TEXT,
    after_json   TEXT
);

CREATE INDEX audit_log_at ON audit_log (at_ms);
