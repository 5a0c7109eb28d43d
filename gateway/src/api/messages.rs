//! Anthropic `/v1/messages` and `/v1/messages/count_tokens`: the `codex_protocol::anthropic`
//! translators as encoders of the one pipeline, over the same lifecycle as `/v1/responses`
//! and `/v1/chat/completions` (failover, quota, usage and affinity behave identically).
//! Errors answer in Anthropic's shape (`api::write_error` picks the dialect by route,
//! `Route::dialect`; after the stream began, one `error` event). This module only translates;
//! it decides nothing.

use std::io;

use bytes::Bytes;
use codex_protocol::{
    anthropic::{
        count_tokens as estimate_tokens, messages_to_responses, MessagesAggregator,
        MessagesRequestOptions, MessagesStream,
    },
    normalize::{Asked, ModelChoice},
    sse::SseEvent,
};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use shared_state::ClientKey;
use sonic_rs::JsonValueTrait;

use super::{affinity_key, open_and_forward, passthrough, write_error, Route, JSON};
use crate::{
    ctx::WorkerCtx,
    error::{Error, ErrorKind, Side},
    lifecycle::RequestPlan,
    models,
    pipeline::{Aggregate, AggregateJson, Encoder, UsageGuard},
    server::h1::{Conn, Request},
};

/// The route of `/v1/messages` (its metrics and usage label, its error dialect).
pub const ROUTE: Route = Route::Messages;
/// The route of `/v1/messages/count_tokens`.
pub const COUNT_ROUTE: Route = Route::CountTokens;

fn now_s() -> u64 {
    shared_state::now_ms() / 1000
}

/// What the requested model resolves to.
#[derive(Default)]
struct ModelPlan {
    upstream: Option<String>,
    effort: Option<String>,
    levels: Vec<String>,
}

/// Resolves the requested model through the catalog and its aliases (`claude-*` names map
/// to a Codex model by an alias, e.g. `"claude-*" = "gpt-5.5"`). A `claude-*` name no alias
/// maps is a 404 even before the catalog was fetched: the upstream would refuse it.
fn resolve_model(ctx: &WorkerCtx, body: &[u8]) -> Result<ModelPlan, Error> {
    let catalog = ctx.catalog.load();
    let requested = sonic_rs::get(body, &["model"])
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned));
    let Some(m) = requested else {
        // The translator reports the missing model in Anthropic's words.
        return Ok(ModelPlan::default());
    };
    let not_found = || Error::new(ErrorKind::ModelNotFound(m.clone()), Side::Downstream);
    let mut plan = ModelPlan::default();
    match models::choose(&catalog, ctx.cfg.strict_models, &m) {
        ModelChoice::Reject => return Err(not_found()),
        ModelChoice::Rewrite { slug, effort } => {
            plan.upstream = Some(slug);
            plan.effort = effort;
        }
        ModelChoice::Keep if m.starts_with("claude") && catalog.resolve(&m).is_none() => {
            return Err(not_found())
        }
        ModelChoice::Keep => {}
    }
    if let Some(r) = catalog.resolve(&m) {
        plan.levels = r.levels.to_vec();
    }
    Ok(plan)
}

/// The `prompt_cache_key` of a Messages request (Anthropic has none): a UUID-shaped digest of
/// the client key id and the client's session signal, `metadata.user_id` (Claude Code puts
/// its session there), else the conversation's opening (`system` and the first message), so
/// the turns of one conversation share the upstream prompt cache and their home account.
fn cache_key(key_id: i64, body: &[u8]) -> Option<String> {
    let user = sonic_rs::get(body, &["metadata", "user_id"]).ok();
    if let Some(u) = user
        .as_ref()
        .and_then(|u| u.as_str())
        .filter(|u| !u.is_empty())
    {
        return Some(super::conversation_cache_key(
            "anthropic-user",
            key_id,
            &[u.as_bytes()],
        ));
    }
    let first = sonic_rs::get(body, sonic_rs::pointer!["messages", 0]).ok()?;
    let system = sonic_rs::get(body, &["system"]).ok();
    let system = system.as_ref().map_or("", |s| s.as_raw_str());
    Some(super::conversation_cache_key(
        "anthropic",
        key_id,
        &[system.as_bytes(), first.as_raw_str().as_bytes()],
    ))
}

/// Serves one Messages request whose body was read and decoded.
pub async fn serve<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    req: Request,
    key: ClientKey,
    keep: bool,
) -> io::Result<bool> {
    let model = match resolve_model(ctx, &req.body) {
        Ok(m) => m,
        Err(e) => return write_error(ctx, conn, ROUTE, &e, keep).await,
    };
    let cache = cache_key(key.id, &req.body);
    let opts = MessagesRequestOptions {
        upstream_model: model.upstream.as_deref(),
        reasoning_levels: &model.levels,
        default_effort: model.effort.as_deref(),
        prompt_cache_key: cache.as_deref(),
    };
    let mut mreq = match messages_to_responses(&req.body, &opts) {
        Ok(r) => r,
        Err(e) => {
            let e = Error::bad_request(e.message, None);
            return write_error(ctx, conn, ROUTE, &e, keep).await;
        }
    };
    let mut usage = UsageGuard::start(
        ctx,
        &key,
        ROUTE.label(),
        mreq.model.clone(),
        mreq.stream,
        conn.usage_id(),
    );
    let plan = RequestPlan {
        route: ROUTE.label(),
        model: mreq.model.clone(),
        asked: Asked::of_body(&mreq.body),
        body: Bytes::from(std::mem::take(&mut mreq.body)),
        passthrough: passthrough(&req),
        key_id: key.id,
        key_limits: std::sync::Arc::clone(&key.limits),
        affinity_key: affinity_key(&req).or_else(|| mreq.prompt_cache_key.clone()),
        upstream_ws: None,
    };
    // The raw request body is not needed past this point: not held for the stream's life.
    let http10 = req.http10;
    drop(req);
    if mreq.stream {
        let mut enc = MessagesSse(MessagesStream::for_request(&mreq, now_s()));
        open_and_forward(ctx, conn, ROUTE, plan, &mut usage, &mut enc, http10, keep).await
    } else {
        let mut enc = AggregateJson::new(MessagesAggregator::for_request(&mreq, now_s()));
        open_and_forward(ctx, conn, ROUTE, plan, &mut usage, &mut enc, http10, keep).await
    }
}

/// `/v1/messages/count_tokens`: `{"input_tokens": n}`, a local estimate (the method is
/// documented in `codex_protocol::anthropic::count_tokens`); nothing goes upstream.
pub async fn count_tokens<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    req: Request,
    _key: ClientKey,
    keep: bool,
) -> io::Result<bool> {
    if let Err(e) = resolve_model(ctx, &req.body) {
        return write_error(ctx, conn, COUNT_ROUTE, &e, keep).await;
    }
    match estimate_tokens(&req.body) {
        Ok(n) => {
            ctx.metrics.request(COUNT_ROUTE.label(), 200);
            let body = format!("{{\"input_tokens\":{n}}}");
            conn.write_response(200, &[JSON], body.as_bytes(), keep)
                .await?;
            Ok(keep)
        }
        Err(e) => {
            let e = Error::bad_request(e.message, None);
            write_error(ctx, conn, COUNT_ROUTE, &e, keep).await
        }
    }
}

/// Anthropic stream events over SSE.
pub struct MessagesSse(MessagesStream);

impl Encoder for MessagesSse {
    fn streaming(&self) -> bool {
        true
    }

    fn event(&mut self, ev: &SseEvent, out: &mut Vec<u8>) {
        self.0.on_event(ev.event_type(), &ev.data, out);
    }

    fn broken(&mut self, _e: &Error, _response_id: Option<&str>, _out: &mut Vec<u8>) {
        // `finish` gets the break as `failed` and writes the one error event.
    }

    fn finish(&mut self, failed: Option<&Error>, out: &mut Vec<u8>) -> Result<(), Error> {
        if let Some(e) = failed {
            let (ty, r) = e.to_anthropic();
            self.0.fail(out, ty, &r.body.message);
        }
        Ok(())
    }
}

impl Aggregate for MessagesAggregator {
    fn on_event(&mut self, event_type: &str, data: &[u8]) {
        MessagesAggregator::on_event(self, event_type, data);
    }

    /// One Anthropic `message` object.
    fn render(self) -> Result<Vec<u8>, Error> {
        self.finish().ok_or_else(|| {
            Error::new(ErrorKind::UpstreamProtocol, Side::Upstream)
                .with_cause("upstream closed the stream before a terminal event")
        })
    }
}
