//! Operations and discovery: `/healthz`, `/metrics`, `/v1/models`.

use std::io;

use monoio::io::{AsyncReadRent, AsyncWriteRent};

use super::{authenticate, write_error, JSON};
use crate::{
    ctx::WorkerCtx,
    models,
    server::h1::{Conn, Request},
};

/// A worker whose heartbeat is older than this is reported stalled.
const STALL_MS: u64 = 3_000;

/// `GET|HEAD /healthz`: whether this instance serves, and what is degraded. 503 only when it
/// cannot serve as it should: draining, or a worker stalled (its share of the listener's
/// connections would hang). Storage or Redis down, an unreachable upstream, accounts whose
/// tokens do not decrypt, a sidecar task that keeps failing (`sidecar.failing`) or the sidecar
/// thread itself dead or blocked (`sidecar.thread`: no refreshes, no usage persistence, no
/// admin API until the process is restarted) are reported (`"status":"degraded"`) with 200:
/// the data plane still serves from its last snapshot.
pub async fn healthz<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    keep: bool,
) -> io::Result<bool> {
    let now = shared_state::now_ms();
    let h = &ctx.health;
    let (alive, workers) = h.workers_alive(now, STALL_MS);
    let storage = h.storage_up();
    let redis = h.redis_up();
    let upstream_failing = h.upstream_failing_since();
    let tasks = h.sidecar_tasks();
    let failing = tasks.failing();
    let thread = tasks.thread(now);
    let snap = ctx.snapshot.load();
    let active = snap
        .accounts
        .iter()
        .filter(|a| a.effective_status() == shared_state::AccountStatus::Active);
    let (mut schedulable, mut no_token) = (0usize, 0usize);
    for a in active {
        if a.access_token.is_empty() {
            no_token += 1;
        } else if a.is_schedulable(now) {
            schedulable += 1;
        }
    }
    drop(snap);
    let status = if ctx.is_draining() {
        "draining"
    } else if alive < workers {
        "worker_stalled"
    } else if !storage
        || redis == Some(false)
        || upstream_failing.is_some()
        || no_token > 0
        || !failing.is_empty()
        || thread.is_down()
    {
        "degraded"
    } else {
        "ok"
    };
    let code = if matches!(status, "draining" | "worker_stalled") {
        503
    } else {
        200
    };
    ctx.metrics.request("healthz", code);
    let body = format!(
        concat!(
            r#"{{"status":"{}","storage":"{}","redis":"{}","#,
            r#""workers":{{"alive":{},"total":{}}},"upstream":"{}","#,
            r#""accounts":{{"schedulable":{},"undecryptable":{}}},"key_limits":"{}","#,
            r#""sidecar":{{"thread":"{}","restarts":{},"failing":[{}]}}}}"#
        ),
        status,
        if storage { "up" } else { "down" },
        match redis {
            None => "off",
            Some(true) => "up",
            Some(false) => "down",
        },
        alive,
        workers,
        if upstream_failing.is_some() {
            "unreachable"
        } else {
            "ok"
        },
        schedulable,
        no_token,
        crate::limits::enforcement(h),
        thread.as_str(),
        tasks.restarts(),
        failing
            .iter()
            .map(|t| format!("\"{t}\""))
            .collect::<Vec<_>>()
            .join(","),
    );
    conn.write_response(code, &[JSON], body.as_bytes(), keep)
        .await?;
    Ok(keep)
}

/// `GET /metrics`: Prometheus text for every worker.
pub async fn metrics<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    keep: bool,
) -> io::Result<bool> {
    ctx.metrics.request("metrics", 200);
    let mut body = ctx.registry.render();
    body.push_str(&crate::metrics::render_forecast(
        &ctx.snapshot.load(),
        shared_state::now_ms(),
    ));
    crate::limits::render_metrics(&ctx.health, &mut body);
    ctx.usage_stats().render(&mut body);
    ctx.health.sidecar_tasks().render(&mut body);
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
