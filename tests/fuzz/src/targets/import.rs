//! `import`: credential-file parsing for `import` (`admin::import`, docs/protocol.md#credential-files):
//! `auth.json`, the flat CPA file, JSON arrays, JSON lines, one token per line, and the JWT
//! claims read from the tokens.
//!
//! Input: the file's text. Invariants: parsing never panics; no skip reason and no source
//! label contains a token from the file (reasons end up in logs and API responses).

use admin::import::fuzzing::{parse, Entry};
use serde_json::Value;

/// The file's name: source labels are it plus `[i]` or `:line`, and only that suffix comes
/// from the file.
const LABEL: &str = "f";

/// Shortest string treated as a secret: real tokens are longer, and shorter ones (or ones
/// with spaces) match the fixed words of the reasons ("refresh_token", serde's messages).
const MIN_SECRET: usize = 16;

/// Collects the strings under token keys (secrets) and every other string (not secret).
fn walk(v: &Value, under_token: bool, secrets: &mut Vec<String>, others: &mut Vec<String>) {
    match v {
        Value::String(s) if under_token => secrets.push(s.trim().to_owned()),
        Value::String(s) => others.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| walk(x, under_token, secrets, others)),
        Value::Object(o) => {
            for (k, x) in o {
                others.push(k.clone());
                walk(x, k.contains("token"), secrets, others);
            }
        }
        _ => {}
    }
}

/// The fuzz target.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let entries = parse(LABEL, text);

    let mut secrets = Vec::new();
    let mut others = Vec::new();
    let trimmed = text.trim_start_matches('\u{feff}').trim();
    match serde_json::from_str::<Value>(trimmed) {
        Ok(v) => walk(&v, false, &mut secrets, &mut others),
        Err(_) => {
            for line in trimmed.lines() {
                let line = line.trim();
                match serde_json::from_str::<Value>(line) {
                    Ok(v) => walk(&v, false, &mut secrets, &mut others),
                    Err(_) => secrets.push(line.trim_matches('"').to_owned()),
                }
            }
        }
    }
    for e in &entries {
        if let Entry::Credential { tokens, .. } = e {
            secrets.extend(tokens.iter().cloned());
        }
    }
    // A "secret" that is also an ordinary value or key in the file may be echoed as that.
    secrets.retain(|s| {
        s.len() >= MIN_SECRET
            && !s.contains(char::is_whitespace)
            && !others.iter().any(|o| o.contains(s.as_str()))
    });

    for e in &entries {
        let (src, reason) = match e {
            Entry::Skipped { src, reason } => (src, reason.as_str()),
            Entry::Credential { src, .. } => (src, ""),
        };
        for s in &secrets {
            assert!(
                !reason.contains(s.as_str()),
                "a skip reason leaks a token: {reason}"
            );
            let suffix = src.strip_prefix(LABEL).unwrap_or(src);
            assert!(
                !suffix.contains(s.as_str()),
                "a source label leaks a token: {src}"
            );
        }
    }
}
