-- Admin API token scope and expiry (issue 28). `read` tokens may only GET; `admin` tokens
-- may do everything, and every token created before scopes existed keeps that. `expires_at`
-- is Unix milliseconds (NULL: never); an expired token is refused like an unknown one.

ALTER TABLE admin_tokens ADD COLUMN scope TEXT NOT NULL DEFAULT 'admin';

ALTER TABLE admin_tokens ADD COLUMN expires_at BIGINT;
