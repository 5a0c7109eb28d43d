//! Operations and discovery: `/healthz`, `/metrics`, `/v1/models` and `/v1/models/{id}` (a
//! key's view of the catalog), the `HEAD /` connectivity probe.

use std::io;

use monoio::io::{AsyncReadRent, AsyncWriteRent};

use shared_state::ClientKey;

use super::{write_error, Route, JSON};
use crate::{
    ctx::WorkerCtx,
    error::{Error, ErrorKind, Side},
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
    ctx.metrics.request(Route::Healthz.label(), code);
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
    ctx.metrics.request(Route::Metrics.label(), 200);
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
/// (`?client_version=`), as the caller's key sees it (its model allow-list).
pub async fn models<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    req: &Request,
    key: &ClientKey,
    keep: bool,
) -> io::Result<bool> {
    let codex_shape = req
        .query
        .as_deref()
        .is_some_and(|q| q.split('&').any(|kv| kv.starts_with("client_version=")));
    let body = models_body(ctx, key, codex_shape);
    ctx.metrics.request(Route::Models.label(), 200);
    conn.write_response(200, &[JSON], &body, keep).await?;
    Ok(keep)
}

/// The model list one key sees, in either shape: the catalog's models and aliases its
/// allow-list admits (the rule the lifecycle enforces, `KeyLimits::allows_model`); every
/// surface that lists models (`/v1/models`, the Codex CLI's `/backend-api/codex/models`)
/// answers with this.
pub fn models_body(ctx: &WorkerCtx, key: &ClientKey, codex_shape: bool) -> Vec<u8> {
    let catalog = ctx.catalog.load();
    if key.limits.allowed_models.is_empty() {
        return models::list(&catalog, codex_shape);
    }
    catalog.list_for(codex_shape, |m| key.limits.allows_model(m))
}

/// `GET /v1/models/{id}`: one model in OpenAI's shape (a listed model or alias, or a name a
/// prefix alias maps), when the caller's key sees it; 404 `model_not_found` otherwise (an
/// unknown id, a prefix pattern itself, a model the key may not use).
pub async fn model<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    req: &Request,
    key: &ClientKey,
    keep: bool,
) -> io::Result<bool> {
    let path = super::route::trimmed(&req.path);
    let id = percent_decode(path.strip_prefix("/v1/models/").unwrap_or_default());
    let body = ctx
        .catalog
        .load()
        .model_for(&id, |m| key.limits.allows_model(m));
    match body {
        Some(b) => {
            ctx.metrics.request(Route::Model.label(), 200);
            conn.write_response(200, &[JSON], &b, keep).await?;
            Ok(keep)
        }
        None => {
            let e = Error::new(ErrorKind::ModelNotFound(id), Side::Downstream);
            write_error(ctx, conn, Route::Model, &e, keep).await
        }
    }
}

/// `HEAD /`: the connectivity probe of Anthropic clients (Claude Code sends one to its base
/// URL): 200, no body, no key needed (it says nothing but that the gateway answers).
pub async fn probe<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    keep: bool,
) -> io::Result<bool> {
    ctx.metrics.request(Route::Probe.label(), 200);
    conn.write_response(200, &[], b"", keep).await?;
    Ok(keep)
}

/// `%XX` escapes of a path segment decoded (model ids are plain, but a client may escape
/// `@`, `:` or `/`); an invalid escape is kept as written.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push(h << 4 | l);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
