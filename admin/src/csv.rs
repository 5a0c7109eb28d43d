//! The CSV exports' cell writers, shared by the usage export (`api::usage`) and the audit log
//! export (`audit`): RFC 3339 times and text cells quoted when needed, with spreadsheet
//! formulas defused (a leading `=`, `+`, `-` or `@` is prefixed with `'`).

/// RFC 3339 (UTC) of a Unix ms instant; empty when out of range.
pub(crate) fn rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// Appends one CSV text cell: quoted when needed, formulas defused.
pub(crate) fn cell(out: &mut String, v: &str) {
    let defuse = v.starts_with(['=', '+', '-', '@']);
    if defuse || v.contains([',', '"', '\n', '\r']) {
        out.push('"');
        if defuse {
            out.push('\'');
        }
        out.push_str(&v.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(v);
    }
}
