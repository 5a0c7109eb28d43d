//! `/v1/chat/completions`: the chat encoder/decoder pair (`codex_protocol::chat`) on top of the
//! same Request -> Attempt -> Stream lifecycle as `/v1/responses`, so failover, quota, usage
//! and affinity behave identically. This module only translates; it decides nothing.

use std::io;

use bytes::Bytes;
use codex_protocol::{
    chat::{
        chat_to_responses, ChatAggregator, ChatRequestOptions, ChatStream, ChatUpstreamFailure,
    },
    classify::Failure,
};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use shared_state::ClientKey;

use codex_protocol::normalize::ModelChoice;

use crate::{
    error::{Error, ErrorKind, Side},
    lifecycle::{self, Next, RequestPlan},
    models,
    routes::{affinity_key, passthrough, sse_headers, write_error, Accounting, StreamGauge},
    server::h1::{Conn, Request},
    ctx::WorkerCtx,
};

const ROUTE: &str = "chat_completions";

fn now_s() -> u64 {
    shared_state::now_ms() / 1000
}

/// A translated upstream failure, as the one gateway error type.
fn failure_error(f: ChatUpstreamFailure) -> Error {
    if f.code.as_deref() == Some("stream_disconnected") {
        return Error::new(ErrorKind::UpstreamProtocol, Side::Upstream).with_cause(f.message);
    }
    Error::upstream(Failure {
        class: f.class,
        status: 200,
        message: Some(f.message),
        code: f.code,
        error_type: Some(f.error_type),
        param: None,
    })
}

/// Serves one chat completion request.
pub async fn chat_completions<S: AsyncReadRent + AsyncWriteRent>(
    ctx: &WorkerCtx,
    conn: &mut Conn<S>,
    req: Request,
    key: ClientKey,
    keep: bool,
) -> io::Result<bool> {
    // Resolve the model against the catalog before translating (aliases, unknown models).
    let catalog = ctx.catalog.load();
    let requested = sonic_rs::get(req.body.as_slice(), &["model"])
        .ok()
        .and_then(|v| sonic_rs::JsonValueTrait::as_str(&v).map(str::to_owned));
    let mut opts = ChatRequestOptions::default();
    let resolved;
    if let Some(m) = requested.as_deref() {
        match models::choose(&catalog, ctx.cfg.strict_models, m) {
            ModelChoice::Reject => {
                let e = Error::new(ErrorKind::ModelNotFound(m.to_owned()), Side::Downstream);
                return write_error(ctx, conn, ROUTE, &e, keep).await;
            }
            ModelChoice::Rewrite { slug, .. } => {
                resolved = slug;
                opts.upstream_model = Some(&resolved);
            }
            ModelChoice::Keep => {}
        }
        if let Some(r) = catalog.resolve(m) {
            opts.reasoning_levels = r.levels;
        }
    }
    let mut creq = match chat_to_responses(&req.body, &opts) {
        Ok(c) => c,
        Err(e) => {
            let e = Error::bad_request(e.message, e.param.as_deref());
            return write_error(ctx, conn, ROUTE, &e, keep).await;
        }
    };
    let acct = Accounting::start(key.id, ROUTE, creq.model.clone(), creq.stream);
    let plan = RequestPlan {
        route: ROUTE,
        model: creq.model.clone(),
        body: Bytes::from(std::mem::take(&mut creq.body)),
        passthrough: passthrough(&req),
        key_id: key.id,
        affinity_key: affinity_key(&req).or_else(|| creq.prompt_cache_key.clone()),
    };
    let mut c = match Box::pin(lifecycle::open(ctx, &plan)).await {
        Ok(c) => c,
        Err(e) => {
            acct.finish(ctx, None, e.to_openai().status, None, None, Some(&e));
            return write_error(ctx, conn, ROUTE, &e, keep).await;
        }
    };
    let account_id = c.account.id;
    let ttfb = c.ttfb;

    if creq.stream {
        let _gauge = StreamGauge::open(ctx);
        conn.release_read_buffer();
        ctx.metrics.request(ROUTE, 200);
        conn.start_stream(200, &sse_headers(&c.headers), req.http10)
            .await?;
        let mut chat = ChatStream::for_request(&creq, now_s());
        let mut out = Vec::new();
        let mut pending = std::mem::take(&mut c.held);
        loop {
            out.clear();
            for ev in &pending {
                lifecycle::observe_event(ctx, &c.account, ev);
                chat.on_event(ev.event_type(), &ev.data, &mut out);
            }
            if chat.is_finished() {
                conn.write_chunk(&out, req.http10).await?;
                break;
            }
            if let Err(e) = conn.write_chunk(&out, req.http10).await {
                acct.finish(ctx, Some(account_id), 499, chat.usage(), Some(ttfb), None);
                return Err(e);
            }
            match c.next_events().await {
                Next::Events(evs) => pending = evs,
                Next::End | Next::Broken(_) => {
                    out.clear();
                    chat.finish(&mut out); // one error object, no [DONE]
                    conn.write_chunk(&out, req.http10).await?;
                    break;
                }
            }
        }
        drop(c);
        let err = chat.failure().cloned().map(failure_error);
        acct.finish(
            ctx,
            Some(account_id),
            200,
            chat.usage(),
            Some(ttfb),
            err.as_ref(),
        );
        conn.finish_stream(req.http10).await?;
        return Ok(keep && !req.http10);
    }

    let mut agg = ChatAggregator::for_request(&creq, now_s());
    let mut pending = std::mem::take(&mut c.held);
    loop {
        for ev in &pending {
            lifecycle::observe_event(ctx, &c.account, ev);
            agg.on_event(ev.event_type(), &ev.data);
        }
        if agg.is_finished() {
            break;
        }
        match c.next_events().await {
            Next::Events(evs) => pending = evs,
            Next::End | Next::Broken(_) => break,
        }
    }
    let visible = std::mem::take(&mut c.headers);
    drop(c);
    let usage = agg.usage();
    match agg.finish() {
        Ok(body) => {
            acct.finish(ctx, Some(account_id), 200, usage, Some(ttfb), None);
            ctx.metrics.request(ROUTE, 200);
            let mut headers: Vec<(&str, &str)> = vec![("content-type", "application/json")];
            for (n, v) in &visible {
                headers.push((n, v.as_str()));
            }
            conn.write_response(200, &headers, &body, keep).await?;
            Ok(keep)
        }
        Err(f) => {
            let e = failure_error(f);
            acct.finish(
                ctx,
                Some(account_id),
                e.to_openai().status,
                usage,
                Some(ttfb),
                Some(&e),
            );
            write_error(ctx, conn, ROUTE, &e, keep).await
        }
    }
}
