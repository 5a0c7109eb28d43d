-- Per-key service tier policy (issue 27): what happens to a key's requests asking for the
-- priority (`fast`) service tier: `pass`, `strip` or `refuse`. NULL: the global
-- `service_tier` setting applies (shared_state::keys::KeyLimits::service_tier_policy).

ALTER TABLE api_keys ADD COLUMN service_tier TEXT;
