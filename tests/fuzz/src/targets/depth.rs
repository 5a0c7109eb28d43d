//! `depth`: deeply nested JSON against the data plane's readers
//! (`codex_protocol::depth` and everything it guards).
//!
//! The other targets' inputs are at most 16 KiB of bytes a mutator changes one at a time, so
//! they never nest more than a few hundred levels, while a stack overflow needs thousands
//! (issue 28: 8,500 levels of `[` aborted the process). This target builds nesting: each
//! input byte is an operation repeated up to 32 times, so a few hundred bytes nest tens of
//! thousands of levels.
//!
//! Input: byte 0 picks the request shape the value is placed in (bare, `input`, chat
//! `messages`, a tool's `parameters`, a field before a WebSocket `type`) and bit 3 truncates
//! the text (malformed JSON); every later byte is `op = b & 7` repeated `(b >> 3) + 1` times:
//! open an array, open an object, close, a scalar, a string full of brackets and escapes, a
//! second key.
//!
//! Invariants:
//! - [`codex_protocol::depth::within`] measures exactly the depth the builder made (complete
//!   texts), and never less than it (truncated ones);
//! - whatever [`codex_protocol::depth::check`] lets through, every reader of the data plane
//!   (sonic-rs's tree and its drop and serialisation, its lazy `get`, the event readers, the
//!   `/v1/responses` normaliser, the chat and Anthropic translators and the token count)
//!   handles on a thread with a worker's 2 MiB stack: an overflow aborts the run.

use codex_protocol::{
    anthropic::{count_tokens, messages_to_responses, MessagesRequestOptions},
    chat::{chat_to_responses, ChatRequestOptions},
    depth,
    normalize::{normalize_responses_with, ModelChoice},
};
use sonic_rs::JsonValueTrait;

/// A worker thread's stack (monoio workers are std threads with the default size).
const WORKER_STACK: usize = 2 << 20;

/// Builds valid JSON from operations, tracking the nesting it makes.
#[derive(Default)]
struct Builder {
    out: Vec<u8>,
    /// Open containers: `true` for an object.
    stack: Vec<bool>,
    /// The innermost container already holds a member (a comma comes before the next).
    filled: Vec<bool>,
    deepest: usize,
    keys: u32,
}

impl Builder {
    /// Starts a value where one may go: a comma (and, in an object, a key) first.
    fn value_slot(&mut self) {
        if let Some(f) = self.filled.last_mut() {
            if *f {
                self.out.push(b',');
            }
            *f = true;
        }
        if self.stack.last() == Some(&true) {
            self.keys += 1;
            self.out
                .extend_from_slice(format!("\"k{}\":", self.keys).as_bytes());
        }
    }

    fn open(&mut self, object: bool) {
        self.value_slot();
        self.out.push(if object { b'{' } else { b'[' });
        self.stack.push(object);
        self.filled.push(false);
        self.deepest = self.deepest.max(self.stack.len());
    }

    fn close(&mut self) {
        if let Some(object) = self.stack.pop() {
            self.filled.pop();
            self.out.push(if object { b'}' } else { b']' });
        }
    }

    fn scalar(&mut self, which: u8) {
        self.value_slot();
        let s: &[u8] = match which % 4 {
            0 => b"1",
            1 => b"null",
            2 => br#""[[{{\"]]}}\\""#,
            _ => br#""\u005b\\\"{""#,
        };
        self.out.extend_from_slice(s);
    }

    fn finish(mut self) -> (Vec<u8>, usize) {
        while !self.stack.is_empty() {
            self.close();
        }
        (self.out, self.deepest)
    }
}

/// The value the operations build.
fn build(ops: &[u8]) -> (Vec<u8>, usize) {
    let mut b = Builder::default();
    // A bare scalar at the top would end the value at once: start with a container.
    b.open(ops.first().is_some_and(|o| o & 1 == 1));
    for &op in ops {
        let times = usize::from(op >> 3) + 1;
        for _ in 0..times {
            match op & 7 {
                0 | 1 => b.open(op & 1 == 1),
                2 | 3 => b.close(),
                4 | 5 => b.scalar(op),
                _ => b.scalar(2),
            }
            if b.stack.is_empty() {
                b.open(false);
            }
        }
    }
    b.finish()
}

/// The value placed in a request of the shape `shape` picks.
fn place(shape: u8, value: &[u8]) -> Vec<u8> {
    let v = String::from_utf8_lossy(value);
    match shape % 5 {
        0 => v.into_owned(),
        1 => format!(r#"{{"model":"gpt-5.5","input":{v}}}"#),
        2 => format!(
            r#"{{"model":"gpt-5.5","max_tokens":16,"messages":[{{"role":"user","content":{v}}}]}}"#
        ),
        3 => format!(
            r#"{{"model":"gpt-5.5","input":"hi","tools":[{{"type":"function","name":"f","parameters":{v}}}]}}"#
        ),
        _ => format!(r#"{{"deep":{v},"type":"response.create"}}"#),
    }
    .into_bytes()
}

/// Every reader the depth check guards, on `body`: the translators themselves, not their
/// targets (whose invariant checks are slow on bodies this size; their own targets hold them).
fn read_everything(body: &[u8]) {
    if let Ok(v) = sonic_rs::from_slice::<sonic_rs::Value>(body) {
        let _ = sonic_rs::to_vec(&v);
        drop(v);
    }
    let _ = sonic_rs::get(body, &["type"]).map(|t| t.as_str().map(str::len));
    let _ = codex_protocol::events::event_type(body);
    let _ = codex_protocol::events::stream_error(body);
    let _ = codex_protocol::events::usage_of_terminal(body);
    let _ = normalize_responses_with(body, &|_| ModelChoice::Keep);
    let _ = chat_to_responses(
        body,
        &ChatRequestOptions {
            default_prompt_cache_key: None,
            upstream_model: None,
            reasoning_levels: &[],
        },
    );
    let opts = MessagesRequestOptions {
        upstream_model: None,
        reasoning_levels: &[],
        default_effort: None,
        prompt_cache_key: None,
    };
    let _ = messages_to_responses(body, &opts);
    let _ = count_tokens(body);
}

/// The fuzz target.
pub fn run(data: &[u8]) {
    let [flags, ops @ ..] = data else {
        return;
    };
    let (value, made) = build(ops);
    let mut body = place(*flags, &value);
    // The wrapper adds its own levels around the value.
    let wrapped = match flags % 5 {
        0 => 0,
        1 | 4 => 1,
        _ => 3,
    };
    let truncated = flags & 8 != 0 && body.len() > 1;
    if truncated {
        let cut = usize::from(flags >> 4) * body.len() / 16;
        body.truncate(cut.max(1));
    }
    let depth = made + wrapped;
    if !truncated {
        assert!(
            depth::within(&body, depth),
            "a text built {depth} deep measured deeper"
        );
        assert!(
            !depth::within(&body, depth - 1),
            "a text built {depth} deep measured shallower"
        );
    } else {
        // A prefix nests no deeper than the whole text.
        assert!(depth::within(&body, depth), "a prefix measured deeper");
    }
    if !depth::check(&body) {
        return;
    }
    let reader = std::thread::Builder::new()
        .name("depth-reader".into())
        .stack_size(WORKER_STACK)
        .spawn(move || read_everything(&body))
        .expect("spawn a reader thread");
    if let Err(p) = reader.join() {
        std::panic::resume_unwind(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_nests_as_deep_as_it_says() {
        let (v, d) = build(&[0xf8; 10]);
        assert_eq!(d, 1 + 320);
        assert!(!depth::check(&v));
        let (v, d) = build(&[0, 4, 1, 5, 2, 6, 3]);
        assert!(
            sonic_rs::from_slice::<sonic_rs::Value>(&v).is_ok(),
            "{}",
            String::from_utf8_lossy(&v)
        );
        assert_eq!(d, 3);
    }

    #[test]
    fn deep_and_shallow_inputs_pass() {
        for flags in 0..32u8 {
            run(&[flags, 0xf8, 0xf8, 0xf8, 0xf8]);
            run(&[flags, 0x08, 0x0c, 0x0a]);
        }
    }
}
