//! Integration tests of the admin crate against real databases (SQLite in a tempdir and
//! PostgreSQL: `CODEX_GATEWAY_TEST_PG_URL`, default `postgres://postgres@127.0.0.1:5432/postgres`;
//! unreachable fails unless `CODEX_GATEWAY_SKIP_PG=1`) and a real Redis for the lease tests
//! (`redis://127.0.0.1:6379`; `CODEX_GATEWAY_SKIP_REDIS=1` skips).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod audit;
mod cli;
mod import;
mod models;
mod proxies;
mod quota;
mod sidecar;
mod storage;
