//! Client-facing HTTP/1.1: our own connection loop over native monoio I/O (docs/io-traps.md).
//!
//! # Key Components
//! - [`h1::Conn`]: reads requests (head, `Content-Length` or chunked body, `Expect:
//!   100-continue`, limits) and writes responses: fixed bodies, or a chunked stream where every
//!   [`h1::Conn::write_chunk`] is one socket write (the head leaves with the first chunk, the
//!   last chunk with the end marker; events are never held back waiting for more, unlike the
//!   monoio-http encoder, docs/io-traps.md#sse-flushing).
//! - [`h1::Request`]: a parsed request with lower-cased header names.
//! - [`h1::Limits`]: the total time budgets of a connection (head, body, each write).
//! - [`admission::ConnGate`]: the global and per-client-IP caps on open connections.
//! - [`encoding::decode`]: request body content codings (zstd, gzip, deflate) with a cap on
//!   the decoded size.
//!
//! # Error handling
//! Malformed input yields [`h1::ReadError`] carrying the status to answer with (400, 413, 431)
//! before the connection is closed. A timeout while waiting for a request closes the
//! connection: a read is never cancelled and then continued (docs/io-traps.md#cancellation).

pub mod admission;
pub mod encoding;
pub mod h1;
