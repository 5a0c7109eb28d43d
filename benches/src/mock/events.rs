//! The SSE event sequence of a `/responses` answer, pre-serialized with string templates (no
//! per-event JSON DOM), and the paced body stream that sends it.
//!
//! # Key Components
//! - [`Plan`]: what one answer looks like (text, deltas, reasoning, tool call, terminal).
//! - [`build`]: renders the whole sequence as `event: <type>\ndata: <json>\n\n` frames, each
//!   JSON repeating `"type"` and carrying `sequence_number`. With [`Plan::tokens`] the text
//!   deltas are a [`TokenRun`] rendered one at a time while streaming (and the events after it
//!   only when the run is over), so long-lived load-test streams cost no memory per event.
//! - [`SseStream`]: yields one frame per event (one HTTP/2 DATA frame or HTTP/1.1 chunk each),
//!   paced on a fixed schedule (`inter_event_delay` apart, without drift), aborting after
//!   `disconnect_after` events, and keeping the mock's active / completed stream counters.

use std::{
    collections::VecDeque,
    future::Future,
    io,
    pin::Pin,
    sync::{atomic::Ordering, Arc},
    task::{ready, Context, Poll},
    time::Duration,
};

use bytes::{BufMut as _, Bytes, BytesMut};
use futures_util::Stream;
use hyper::body::Frame;
use tokio::time::{Instant, Sleep};

use super::{
    errors::stream_error,
    state::{rand_hex, Shared},
};

/// Minimum pause before an abort, so the events before it leave the socket first.
const ABORT_FLUSH_PAUSE: Duration = Duration::from_millis(10);

/// Reasoning summary streamed in reasoning mode.
const REASONING_TEXT: &str =
    "**Answering the mock request**\n\nThe mock upstream is producing a canned answer.";

/// The delta of every event of a [`TokenRun`].
pub(crate) const TOKEN: &str = "tok ";

/// The shape of one successful (or in-stream failing) answer.
pub(crate) struct Plan<'a> {
    /// The request's `model`, echoed in the response object.
    pub(crate) model: &'a str,
    /// `service_tier` of the response object.
    pub(crate) service_tier: &'a str,
    pub(crate) text: &'a str,
    pub(crate) deltas: usize,
    /// `Some(n)`: the text answer is `n` deltas of [`TOKEN`] (`text` / `deltas` are ignored).
    pub(crate) tokens: Option<u64>,
    pub(crate) reasoning: bool,
    /// The reasoning item's `encrypted_content` (minted for the serving account; `None` when
    /// the request did not ask for it with `include`).
    pub(crate) encrypted: Option<String>,
    /// Remote compaction v2: the answer is exactly one `compaction` item carrying this blob.
    pub(crate) compaction: Option<String>,
    /// `(name, arguments JSON)` of a function call answer.
    pub(crate) tool: Option<(&'a str, &'a str)>,
    pub(crate) incomplete: Option<&'a str>,
    pub(crate) empty_completed_output: bool,
    pub(crate) fail_in_stream: Option<&'a str>,
    pub(crate) fail_after_output: Option<&'a str>,
    pub(crate) input_tokens: u64,
    pub(crate) cached_tokens: u64,
}

/// The rendered events; `terminal` says whether the last one ends the response.
pub(crate) struct Rendered {
    /// The response id (`resp_...`) carried by every response object of the sequence.
    pub(crate) id: String,
    /// Every event, or with a [`TokenRun`] the events before it.
    pub(crate) events: Vec<Bytes>,
    /// Generated deltas after `events`, then the rest of the answer.
    pub(crate) run: Option<TokenRun>,
    pub(crate) terminal: bool,
}

/// Lazily rendered `response.output_text.delta` events, then the events after them.
pub(crate) struct TokenRun {
    left: u64,
    seq: u64,
    /// `event: ...\ndata: {"type":...,"sequence_number":`
    prefix: &'static [u8],
    /// `,"item_id":...,"delta":"tok ","logprobs":[]}\n\n`
    suffix: Bytes,
    /// Renders the events after the run (done events and the terminal).
    tail: Option<Box<dyn FnOnce() -> Vec<Bytes> + Send>>,
}

// === impl TokenRun ===

impl TokenRun {
    /// The next delta event, or `None` when the run is over.
    fn next_delta(&mut self) -> Option<Bytes> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let mut b = BytesMut::with_capacity(self.prefix.len() + 20 + self.suffix.len());
        b.put_slice(self.prefix);
        b.put_slice(itoa_buf(self.seq).as_bytes());
        b.put_slice(&self.suffix);
        self.seq += 1;
        Some(b.freeze())
    }
}

/// Decimal rendering of `n` without going through `fmt` machinery per event.
fn itoa_buf(mut n: u64) -> Digits {
    let mut d = Digits {
        buf: [0; 20],
        start: 20,
    };
    loop {
        d.start -= 1;
        d.buf[d.start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    d
}

struct Digits {
    buf: [u8; 20],
    start: usize,
}

impl Digits {
    fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// JSON string literal of `s` (quotes included).
fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

/// Splits `text` into at most `n` non-empty pieces of near-equal char count (`n == 0`: none).
pub(crate) fn split_deltas(text: &str, n: usize) -> Vec<&str> {
    let starts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    let count = starts.len();
    if n == 0 || count == 0 {
        return Vec::new();
    }
    let n = n.min(count);
    (0..n)
        .map(|k| {
            let s = starts[k * count / n];
            let e = if k + 1 == n {
                text.len()
            } else {
                starts[(k + 1) * count / n]
            };
            &text[s..e]
        })
        .collect()
}

struct Builder {
    out: Vec<Bytes>,
    seq: u64,
    id: String,
    created_at: u64,
    model: String,
    tier: String,
}

/// What the terminal event needs, owned so a [`TokenRun`] can render it later.
struct Ending {
    incomplete: Option<String>,
    empty_completed_output: bool,
    fail_after_output: Option<String>,
    input_tokens: u64,
    cached_tokens: u64,
}

impl Builder {
    fn push(&mut self, ty: &str, rest: &str) {
        let s = format!(
            "event: {ty}\ndata: {{\"type\":\"{ty}\",\"sequence_number\":{},{rest}}}\n\n",
            self.seq
        );
        self.seq += 1;
        self.out.push(Bytes::from(s));
    }

    /// The `response` object; `output` is the inside of the array.
    fn response(
        &self,
        status: &str,
        error: &str,
        incomplete: &str,
        output: &str,
        usage: &str,
    ) -> String {
        format!(
            "\"response\":{{\"id\":\"{id}\",\"object\":\"response\",\"created_at\":{created},\
             \"status\":\"{status}\",\"background\":false,\"error\":{error},\
             \"incomplete_details\":{incomplete},\"instructions\":null,\"model\":{model},\
             \"output\":[{output}],\"parallel_tool_calls\":true,\"reasoning\":null,\
             \"service_tier\":{tier},\"store\":false,\"tool_choice\":\"auto\",\"tools\":[],\
             \"usage\":{usage}}}",
            id = self.id,
            created = self.created_at,
            model = self.model,
            tier = self.tier,
        )
    }

    fn failed(&mut self, code: &str) {
        let (message, ty) = stream_error(code);
        let error = format!(
            "{{\"code\":{},\"message\":{},\"type\":\"{ty}\"}}",
            js(code),
            js(message)
        );
        let r = self.response("failed", &error, "null", "", "null");
        self.push("response.failed", &r);
    }

    /// `output_text.done`, `content_part.done`, `output_item.done` of the message `id`;
    /// returns the item JSON.
    fn message_done(
        &mut self,
        id: &str,
        head: &str,
        idx: usize,
        text: &str,
        status: &str,
    ) -> String {
        let text = js(text);
        self.push(
            "response.output_text.done",
            &format!("{head},\"text\":{text},\"logprobs\":[]"),
        );
        let part = format!(
            "{{\"type\":\"output_text\",\"annotations\":[],\"logprobs\":[],\"text\":{text}}}"
        );
        self.push(
            "response.content_part.done",
            &format!("{head},\"part\":{part}"),
        );
        let item = format!(
            "{{\"id\":\"{id}\",\"type\":\"message\",\"status\":\"{status}\",\"content\":[{part}],\"role\":\"assistant\"}}"
        );
        self.push(
            "response.output_item.done",
            &format!("\"output_index\":{idx},\"item\":{item}"),
        );
        item
    }

    /// The terminal event: `response.completed` or `response.incomplete` with usage.
    fn terminal(
        &mut self,
        output: &[String],
        output_tokens: u64,
        reasoning_tokens: u64,
        end: &Ending,
    ) {
        let output_tokens = output_tokens.max(1);
        let usage = format!(
            "{{\"input_tokens\":{i},\"input_tokens_details\":{{\"cached_tokens\":{c}}},\
             \"output_tokens\":{output_tokens},\"output_tokens_details\":{{\"reasoning_tokens\":{reasoning_tokens}}},\
             \"total_tokens\":{t}}}",
            i = end.input_tokens,
            c = end.cached_tokens.min(end.input_tokens),
            t = end.input_tokens + output_tokens,
        );
        let output = output.join(",");
        if let Some(reason) = &end.incomplete {
            let inc = format!("{{\"reason\":{}}}", js(reason));
            let r = self.response("incomplete", "null", &inc, &output, &usage);
            self.push("response.incomplete", &r);
        } else {
            let shown = if end.empty_completed_output {
                ""
            } else {
                output.as_str()
            };
            let r = self.response("completed", "null", "null", shown, &usage);
            self.push("response.completed", &r);
        }
    }
}

/// Renders the full event sequence of `plan`.
pub(crate) fn build(plan: &Plan<'_>) -> Rendered {
    let mut b = Builder {
        out: Vec::with_capacity(plan.deltas * 2 + 12),
        seq: 0,
        id: format!("resp_{}", rand_hex(16)),
        created_at: super::state::now_unix(),
        model: js(plan.model),
        tier: js(plan.service_tier),
    };
    let end = Ending {
        incomplete: plan.incomplete.map(str::to_owned),
        empty_completed_output: plan.empty_completed_output,
        fail_after_output: plan.fail_after_output.map(str::to_owned),
        input_tokens: plan.input_tokens,
        cached_tokens: plan.cached_tokens,
    };
    let r = b.response("in_progress", "null", "null", "", "null");
    b.push("response.created", &r);
    b.push("response.in_progress", &r);
    if let Some(code) = plan.fail_in_stream {
        b.failed(code);
        return Rendered {
            id: b.id,
            events: b.out,
            run: None,
            terminal: true,
        };
    }

    let mut output: Vec<String> = Vec::new();
    let mut reasoning_tokens = 0u64;
    if plan.reasoning {
        let id = format!("rs_{}", rand_hex(16));
        let idx = output.len();
        b.push(
            "response.output_item.added",
            &format!("\"output_index\":{idx},\"item\":{{\"id\":\"{id}\",\"type\":\"reasoning\",\"summary\":[]}}"),
        );
        let head = format!("\"item_id\":\"{id}\",\"output_index\":{idx},\"summary_index\":0");
        b.push(
            "response.reasoning_summary_part.added",
            &format!("{head},\"part\":{{\"type\":\"summary_text\",\"text\":\"\"}}"),
        );
        for d in split_deltas(REASONING_TEXT, plan.deltas) {
            reasoning_tokens += 1;
            b.push(
                "response.reasoning_summary_text.delta",
                &format!("{head},\"delta\":{}", js(d)),
            );
        }
        let text = js(REASONING_TEXT);
        b.push(
            "response.reasoning_summary_text.done",
            &format!("{head},\"text\":{text}"),
        );
        b.push(
            "response.reasoning_summary_part.done",
            &format!("{head},\"part\":{{\"type\":\"summary_text\",\"text\":{text}}}"),
        );
        let encrypted = plan
            .encrypted
            .as_deref()
            .map(|e| format!(",\"encrypted_content\":{}", js(e)))
            .unwrap_or_default();
        let item = format!(
            "{{\"id\":\"{id}\",\"type\":\"reasoning\",\"summary\":[{{\"type\":\"summary_text\",\"text\":{text}}}]{encrypted}}}"
        );
        b.push(
            "response.output_item.done",
            &format!("\"output_index\":{idx},\"item\":{item}"),
        );
        output.push(item);
    }

    let idx = output.len();
    let mut output_tokens = reasoning_tokens;
    if let Some(blob) = &plan.compaction {
        // Remote compaction v2: one `compaction` item, nothing else (the client refuses any
        // other answer).
        let id = format!("cmp_{}", rand_hex(16));
        let item = format!(
            "{{\"id\":\"{id}\",\"type\":\"compaction\",\"encrypted_content\":{}}}",
            js(blob)
        );
        b.push(
            "response.output_item.added",
            &format!("\"output_index\":{idx},\"item\":{item}"),
        );
        b.push(
            "response.output_item.done",
            &format!("\"output_index\":{idx},\"item\":{item}"),
        );
        output.push(item);
        b.terminal(&output, output_tokens + 1, reasoning_tokens, &end);
        return Rendered {
            id: b.id,
            events: b.out,
            run: None,
            terminal: true,
        };
    }
    if let Some((name, args)) = plan.tool {
        let id = format!("fc_{}", rand_hex(16));
        let call_id = format!("call_{}", rand_hex(12));
        let name = js(name);
        b.push(
            "response.output_item.added",
            &format!(
                "\"output_index\":{idx},\"item\":{{\"id\":\"{id}\",\"type\":\"function_call\",\
                 \"status\":\"in_progress\",\"arguments\":\"\",\"call_id\":\"{call_id}\",\"name\":{name}}}"
            ),
        );
        let pieces = split_deltas(args, plan.deltas);
        let cut = plan.fail_after_output.map(|_| pieces.len().div_ceil(2));
        for (i, d) in pieces.iter().enumerate() {
            if cut == Some(i) {
                break;
            }
            output_tokens += 1;
            b.push(
                "response.function_call_arguments.delta",
                &format!(
                    "\"item_id\":\"{id}\",\"output_index\":{idx},\"delta\":{}",
                    js(d)
                ),
            );
        }
        if let Some(code) = plan.fail_after_output {
            b.failed(code);
            return Rendered {
                id: b.id,
                events: b.out,
                run: None,
                terminal: true,
            };
        }
        let args = js(args);
        b.push(
            "response.function_call_arguments.done",
            &format!(
                "\"item_id\":\"{id}\",\"output_index\":{idx},\"name\":{name},\"arguments\":{args}"
            ),
        );
        let item = format!(
            "{{\"id\":\"{id}\",\"type\":\"function_call\",\"status\":\"completed\",\
             \"arguments\":{args},\"call_id\":\"{call_id}\",\"name\":{name}}}"
        );
        b.push(
            "response.output_item.done",
            &format!("\"output_index\":{idx},\"item\":{item}"),
        );
        output.push(item);
    } else {
        let id = format!("msg_{}", rand_hex(16));
        b.push(
            "response.output_item.added",
            &format!(
                "\"output_index\":{idx},\"item\":{{\"id\":\"{id}\",\"type\":\"message\",\
                 \"status\":\"in_progress\",\"content\":[],\"role\":\"assistant\"}}"
            ),
        );
        let head = format!("\"item_id\":\"{id}\",\"output_index\":{idx},\"content_index\":0");
        b.push(
            "response.content_part.added",
            &format!("{head},\"part\":{{\"type\":\"output_text\",\"annotations\":[],\"logprobs\":[],\"text\":\"\"}}"),
        );
        if let Some(n) = plan.tokens {
            return token_run(
                b,
                end,
                id,
                head,
                idx,
                n,
                output,
                output_tokens,
                reasoning_tokens,
            );
        }
        let pieces = split_deltas(plan.text, plan.deltas);
        let cut = plan.fail_after_output.map(|_| pieces.len().div_ceil(2));
        for (i, d) in pieces.iter().enumerate() {
            if cut == Some(i) {
                break;
            }
            output_tokens += 1;
            b.push(
                "response.output_text.delta",
                &format!("{head},\"delta\":{},\"logprobs\":[]", js(d)),
            );
        }
        if let Some(code) = plan.fail_after_output {
            b.failed(code);
            return Rendered {
                id: b.id,
                events: b.out,
                run: None,
                terminal: true,
            };
        }
        let status = if plan.incomplete.is_some() {
            "incomplete"
        } else {
            "completed"
        };
        output.push(b.message_done(&id, &head, idx, plan.text, status));
    }

    b.terminal(&output, output_tokens, reasoning_tokens, &end);
    Rendered {
        id: b.id,
        events: b.out,
        run: None,
        terminal: true,
    }
}

/// The answer to a WebSocket warm-up (`generate: false`): `response.created` and
/// `response.completed` with an empty output and no output tokens (no model turn).
pub(crate) fn warmup(model: &str, service_tier: &str, input_tokens: u64) -> Rendered {
    let mut b = Builder {
        out: Vec::with_capacity(2),
        seq: 0,
        id: format!("resp_{}", rand_hex(16)),
        created_at: super::state::now_unix(),
        model: js(model),
        tier: js(service_tier),
    };
    let r = b.response("in_progress", "null", "null", "", "null");
    b.push("response.created", &r);
    let usage = format!(
        "{{\"input_tokens\":{input_tokens},\"input_tokens_details\":{{\"cached_tokens\":0}},\
         \"output_tokens\":0,\"output_tokens_details\":{{\"reasoning_tokens\":0}},\
         \"total_tokens\":{input_tokens}}}"
    );
    let r = b.response("completed", "null", "null", "", &usage);
    b.push("response.completed", &r);
    Rendered {
        id: b.id,
        events: b.out,
        run: None,
        terminal: true,
    }
}

/// The JSON of one rendered SSE frame (`event: X\ndata: <json>\n\n` → `<json>`), without
/// copying: what a WebSocket text frame carries.
pub(crate) fn sse_data(frame: &Bytes) -> Bytes {
    const DATA: &[u8] = b"\ndata: ";
    let start = frame
        .windows(DATA.len())
        .position(|w| w == DATA)
        .map_or(0, |i| i + DATA.len());
    let end = if frame.ends_with(b"\n\n") {
        frame.len() - 2
    } else {
        frame.len()
    };
    frame.slice(start..end.max(start))
}

/// The message answer of `n` generated [`TOKEN`] deltas: the events so far, then a
/// [`TokenRun`] whose tail renders the done events and the terminal once the run is over.
#[allow(clippy::too_many_arguments)]
fn token_run(
    mut b: Builder,
    end: Ending,
    id: String,
    head: String,
    idx: usize,
    n: u64,
    mut output: Vec<String>,
    output_tokens: u64,
    reasoning_tokens: u64,
) -> Rendered {
    const PREFIX: &[u8] = b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":";
    let count = match end.fail_after_output {
        Some(_) => n.div_ceil(2),
        None => n,
    };
    let suffix = Bytes::from(format!(
        ",{head},\"delta\":{},\"logprobs\":[]}}\n\n",
        js(TOKEN)
    ));
    let events = std::mem::take(&mut b.out);
    let id_of_response = b.id.clone();
    let seq = b.seq;
    b.seq += count;
    let tail = move || {
        if let Some(code) = &end.fail_after_output {
            b.failed(code);
            return b.out;
        }
        let status = if end.incomplete.is_some() {
            "incomplete"
        } else {
            "completed"
        };
        let text = TOKEN.repeat(usize::try_from(count).unwrap_or(0));
        output.push(b.message_done(&id, &head, idx, &text, status));
        b.terminal(&output, output_tokens + count, reasoning_tokens, &end);
        b.out
    };
    Rendered {
        id: id_of_response,
        events,
        run: Some(TokenRun {
            left: count,
            seq,
            prefix: PREFIX,
            suffix,
            tail: Some(Box::new(tail)),
        }),
        terminal: true,
    }
}

/// The SSE body: yields the rendered events with pacing, counts itself in the mock's
/// counters.
pub(crate) struct SseStream {
    queue: VecDeque<Bytes>,
    run: Option<TokenRun>,
    /// Events yielded so far.
    sent: usize,
    /// Events sent without a pause first: 1, or with a [`TokenRun`] every event before it
    /// (the stream opens at once, like the backend's `created` / `in_progress` /
    /// `output_item.added`, and only the tokens are paced).
    unpaced: usize,
    terminal: bool,
    delay: Duration,
    disconnect_after: Option<usize>,
    /// After this many events nothing more is sent; the stream stays open.
    stall_after: Option<usize>,
    /// When the next event is due (fixed schedule: `delay` after the previous due time).
    due: Option<Instant>,
    sleep: Pin<Box<Sleep>>,
    armed: bool,
    done: bool,
    shared: Arc<Shared>,
}

// === impl SseStream ===

impl SseStream {
    /// Must be called inside the server's runtime (it creates a timer).
    pub(crate) fn new(
        rendered: Rendered,
        delay: Duration,
        disconnect_after: Option<usize>,
        stall_after: Option<usize>,
        shared: Arc<Shared>,
    ) -> Self {
        shared
            .counters
            .active_streams
            .fetch_add(1, Ordering::SeqCst);
        let unpaced = if rendered.run.is_some() {
            rendered.events.len().max(1)
        } else {
            1
        };
        Self {
            queue: rendered.events.into(),
            run: rendered.run,
            sent: 0,
            unpaced,
            terminal: rendered.terminal,
            delay,
            disconnect_after,
            stall_after,
            due: None,
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: false,
            done: false,
            shared,
        }
    }

    /// The next event to send, rendering the token run (and its tail) on demand.
    fn next_event(&mut self) -> Option<Bytes> {
        if let Some(ev) = self.queue.pop_front() {
            return Some(ev);
        }
        let run = self.run.as_mut()?;
        if let Some(ev) = run.next_delta() {
            return Some(ev);
        }
        let tail = run.tail.take();
        self.run = None;
        self.queue.extend(tail.map(|t| t()).unwrap_or_default());
        self.queue.pop_front()
    }

    pub(crate) fn is_exhausted(&self) -> bool {
        self.queue.is_empty() && self.run.is_none()
    }
}

impl Stream for SseStream {
    type Item = Result<Frame<Bytes>, io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done || this.is_exhausted() {
            return Poll::Ready(None);
        }
        if this.stall_after.is_some_and(|k| this.sent >= k) {
            // Hung: never ready again (dropped when the peer resets the stream).
            return Poll::Pending;
        }
        let disconnect = this.disconnect_after.is_some_and(|k| this.sent >= k);
        // Pause before every event but the unpaced ones (the first, or everything before a
        // token run), and before an abort: the pause lets the connection flush what was
        // sent, so the peer sees exactly `disconnect_after` events.
        // Events are due on a fixed schedule (`delay` after the previous due time, never in
        // the past), so timer rounding does not lower the rate.
        let pause = if disconnect {
            this.delay.max(ABORT_FLUSH_PAUSE)
        } else if this.sent >= this.unpaced {
            this.delay
        } else {
            Duration::ZERO
        };
        if !pause.is_zero() {
            if !this.armed {
                let now = Instant::now();
                let due = this.due.map_or(now + pause, |d| (d + pause).max(now));
                this.due = Some(due);
                this.sleep.as_mut().reset(due);
                this.armed = true;
            }
            ready!(this.sleep.as_mut().poll(cx));
            this.armed = false;
        } else if this.due.is_none() {
            this.due = Some(Instant::now());
        }
        if disconnect {
            this.done = true;
            return Poll::Ready(Some(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "mock-codex: disconnect-after",
            ))));
        }
        let Some(ev) = this.next_event() else {
            return Poll::Ready(None);
        };
        this.sent += 1;
        if this.is_exhausted() && this.terminal {
            this.shared
                .counters
                .completed_streams
                .fetch_add(1, Ordering::SeqCst);
        }
        Poll::Ready(Some(Ok(Frame::data(ev))))
    }
}

impl Drop for SseStream {
    fn drop(&mut self) {
        self.shared
            .counters
            .active_streams
            .fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn plan() -> Plan<'static> {
        Plan {
            model: "gpt-5.1-codex",
            service_tier: "default",
            text: "Hello, wörld!",
            deltas: 4,
            tokens: None,
            reasoning: false,
            encrypted: None,
            compaction: None,
            tool: None,
            incomplete: None,
            empty_completed_output: false,
            fail_in_stream: None,
            fail_after_output: None,
            input_tokens: 10,
            cached_tokens: 0,
        }
    }

    fn parse(r: &Rendered) -> Vec<serde_json::Value> {
        r.events
            .iter()
            .map(|e| {
                let s = std::str::from_utf8(e).unwrap();
                let (ev, data) = s.strip_suffix("\n\n").unwrap().split_once('\n').unwrap();
                let v: serde_json::Value =
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(ev.strip_prefix("event: ").unwrap(), v["type"]);
                v
            })
            .collect()
    }

    #[test]
    fn split_is_even_and_lossless() {
        let p = split_deltas("Hello, wörld!", 4);
        assert_eq!(p.len(), 4);
        assert_eq!(p.concat(), "Hello, wörld!");
        assert_eq!(split_deltas("ab", 8), vec!["a", "b"]);
        assert!(split_deltas("ab", 0).is_empty());
    }

    #[test]
    fn message_sequence_is_complete_and_numbered() {
        let evs = parse(&build(&plan()));
        let types: Vec<&str> = evs.iter().map(|v| v["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, v) in evs.iter().enumerate() {
            assert_eq!(v["sequence_number"], i as u64);
        }
        let done = &evs[11]["response"];
        assert_eq!(done["output"][0]["content"][0]["text"], "Hello, wörld!");
        assert_eq!(done["usage"]["total_tokens"], 14);
    }

    #[test]
    fn reasoning_then_tool_call() {
        let mut p = plan();
        p.reasoning = true;
        p.tool = Some(("exec_command", r#"{"cmd":"echo hi"}"#));
        let evs = parse(&build(&p));
        let last = &evs.last().unwrap()["response"];
        assert_eq!(last["output"][0]["type"], "reasoning");
        assert_eq!(last["output"][1]["type"], "function_call");
        assert_eq!(last["output"][1]["arguments"], r#"{"cmd":"echo hi"}"#);
        let args: String = evs
            .iter()
            .filter(|v| v["type"] == "response.function_call_arguments.delta")
            .map(|v| v["delta"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(args, r#"{"cmd":"echo hi"}"#);
        assert!(
            last["usage"]["output_tokens_details"]["reasoning_tokens"]
                .as_u64()
                .unwrap()
                > 0
        );
    }

    #[test]
    fn compaction_is_one_item_and_reasoning_carries_its_blob() {
        let mut p = plan();
        p.compaction = Some("gAAAAABmockcmp".to_owned());
        let evs = parse(&build(&p));
        let last = evs.last().unwrap();
        assert_eq!(last["type"], "response.completed");
        assert_eq!(last["response"]["output"].as_array().unwrap().len(), 1);
        assert_eq!(last["response"]["output"][0]["type"], "compaction");
        assert_eq!(
            last["response"]["output"][0]["encrypted_content"],
            "gAAAAABmockcmp"
        );

        let mut p = plan();
        p.reasoning = true;
        p.encrypted = Some("gAAAAABmockrs".to_owned());
        let evs = parse(&build(&p));
        let out = &evs.last().unwrap()["response"]["output"];
        assert_eq!(out[0]["encrypted_content"], "gAAAAABmockrs");
        p.encrypted = None;
        let evs = parse(&build(&p));
        assert!(evs.last().unwrap()["response"]["output"][0]
            .get("encrypted_content")
            .is_none());
    }
}
