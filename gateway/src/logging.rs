//! Process logging: `tracing` to stderr, plain text or one JSON object per line.
//!
//! # Key Components
//! - [`LogFormat`]: `text` (the default) or `json` (`--log-format`, `CODEX_GATEWAY_LOG_FORMAT`).
//! - [`init`]: installs the subscriber; ANSI colours only when stderr is a terminal (a log file
//!   or a journal never receives escape codes). `RUST_LOG` filters, `info` by default.
//! - [`JsonFormat`]: `{"ts":..,"level":..,"target":..,"message":..,<fields>,"span":..}` per
//!   event, every string escaped as JSON (no new dependency: sonic-rs escapes).
//!
//! # Error handling
//! A subscriber already installed (tests) is left in place.

use std::{fmt, io::IsTerminal};

use tracing::{
    field::{Field, Visit},
    Event, Subscriber,
};
use tracing_subscriber::{
    fmt::{format::Writer, FmtContext, FormatEvent, FormatFields},
    registry::LookupSpan,
    EnvFilter,
};

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the process subscriber (stderr).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.event_format(JsonFormat).try_init(),
    };
}

/// One JSON object per event.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonFormat;

fn push_json_str(out: &mut String, s: &str) {
    match sonic_rs::to_string(s) {
        Ok(q) => out.push_str(&q),
        Err(_) => out.push_str("\"\""),
    }
}

/// Collects an event's fields as JSON members.
struct JsonFields {
    out: String,
    message: Option<String>,
}

impl Visit for JsonFields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.to_owned());
            return;
        }
        self.out.push(',');
        push_json_str(&mut self.out, field.name());
        self.out.push(':');
        push_json_str(&mut self.out, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.out.push(',');
        push_json_str(&mut self.out, field.name());
        self.out.push_str(&format!(":{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.out.push(',');
        push_json_str(&mut self.out, field.name());
        self.out.push_str(&format!(":{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.out.push(',');
        push_json_str(&mut self.out, field.name());
        self.out.push_str(if value { ":true" } else { ":false" });
    }
}

impl<S, N> FormatEvent<S, N> for JsonFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut fields = JsonFields {
            out: String::new(),
            message: None,
        };
        event.record(&mut fields);
        let mut line = String::with_capacity(128 + fields.out.len());
        line.push_str(&format!("{{\"ts\":{ts:.6},\"level\":"));
        push_json_str(&mut line, meta.level().as_str());
        line.push_str(",\"target\":");
        push_json_str(&mut line, meta.target());
        line.push_str(",\"message\":");
        push_json_str(&mut line, fields.message.as_deref().unwrap_or(""));
        line.push_str(&fields.out);
        if let Some(scope) = ctx.event_scope() {
            let names: Vec<&str> = scope.from_root().map(|s| s.name()).collect();
            if !names.is_empty() {
                line.push_str(",\"span\":");
                push_json_str(&mut line, &names.join(":"));
            }
        }
        if let Some(name) = std::thread::current().name() {
            line.push_str(",\"thread\":");
            push_json_str(&mut line, name);
        }
        line.push('}');
        writeln!(writer, "{line}")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_are_json_and_text_has_no_ansi_when_asked() {
        let buf = Buf::default();
        let w = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .event_format(JsonFormat)
            .finish();
        tracing::subscriber::with_default(sub, || {
            tracing::warn!(worker = 3, ok = true, path = "a\"b\n", "hello \"world\"");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let line = text.lines().next().unwrap();
        let v: sonic_rs::Value = sonic_rs::from_str(line).unwrap();
        use sonic_rs::JsonValueTrait;
        assert_eq!(v["level"].as_str(), Some("WARN"));
        assert_eq!(v["message"].as_str(), Some("hello \"world\""));
        assert_eq!(v["worker"].as_u64(), Some(3));
        assert_eq!(v["ok"].as_bool(), Some(true));
        assert_eq!(v["path"].as_str(), Some("a\"b\n"));
        assert!(!text.contains('\x1b'));
    }
}
