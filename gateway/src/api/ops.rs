//! Operations and discovery: `/healthz`, `/metrics`, `/v1/models`.

use std::io;

use monoio::io::{AsyncReadRent, AsyncWriteRent};

use super::{authenticate, write_error, JSON};
use crate::{
    ctx::WorkerCtx,
    models,
    server::h1::{Conn, Request},
};

/// `GET|HEAD /healthz`: 200 while storage is up and the worker is not draining.
pub async fn healthz<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    keep: bool,
) -> io::Result<bool> {
    let up = ctx.health.storage_up();
    ctx.metrics.request("healthz", if up { 200 } else { 503 });
    if up && !ctx.is_draining() {
        conn.write_response(200, &[JSON], br#"{"status":"ok"}"#, keep)
            .await?;
    } else {
        let st = if ctx.is_draining() {
            "draining"
        } else {
            "storage_down"
        };
        conn.write_response(
            503,
            &[JSON],
            format!("{{\"status\":\"{st}\"}}").as_bytes(),
            keep,
        )
        .await?;
    }
    Ok(keep)
}

/// `GET /metrics`: Prometheus text for every worker.
pub async fn metrics<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    keep: bool,
) -> io::Result<bool> {
    ctx.metrics.request("metrics", 200);
    let body = ctx.registry.render();
    conn.write_response(
        200,
        &[("content-type", "text/plain; version=0.0.4")],
        body.as_bytes(),
        keep,
    )
    .await?;
    Ok(keep)
}

/// `GET /v1/models`: the OpenAI list, or the Codex catalog shape when the Codex CLI asks
/// (`?client_version=`).
pub async fn models<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    req: &Request,
    keep: bool,
) -> io::Result<bool> {
    if let Err(e) = authenticate(ctx, req) {
        return write_error(ctx, conn, "models", &e, keep).await;
    }
    let codex_shape = req
        .query
        .as_deref()
        .is_some_and(|q| q.split('&').any(|kv| kv.starts_with("client_version=")));
    let body = models::list(&ctx.catalog.load(), codex_shape);
    ctx.metrics.request("models", 200);
    conn.write_response(200, &[JSON], &body, keep).await?;
    Ok(keep)
}
