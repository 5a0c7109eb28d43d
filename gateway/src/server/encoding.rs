//! Request body content codings: `zstd` (what the Codex CLI's built-in provider sends over
//! HTTP, docs/protocol.md#what-real-clients-send), `gzip` and `deflate` (other clients), `identity`.
//!
//! # Key Components
//! - [`decode`]: turns a received body into the JSON the routes parse, never producing more
//!   than the body limit: a small compressed body that expands past it (a "zip bomb") stops
//!   decoding at the limit and is refused with 413, costing at most `limit` bytes of memory.
//!
//! # Error handling
//! [`DecodeError`] names the failure; the routes map it to the client's dialect (415 for an
//! unknown coding, 400 for a corrupt body, 413 past the limit).

use std::io::Read;

/// Why a body could not be decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// A coding we do not implement (the name as sent).
    Unsupported(String),
    /// The body is not valid in its declared coding.
    Malformed(&'static str),
    /// The decoded body would exceed the limit.
    TooLarge,
}

/// Decodes `body` as declared by `Content-Encoding` (a comma-separated list, applied in
/// order, so decoded in reverse). At most `limit` decoded bytes are produced.
pub fn decode(
    content_encoding: Option<&str>,
    body: Vec<u8>,
    limit: usize,
) -> Result<Vec<u8>, DecodeError> {
    let Some(header) = content_encoding else {
        return Ok(body);
    };
    let codings: Vec<String> = header
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .filter(|c| !c.is_empty() && c != "identity")
        .collect();
    if codings.len() > 2 {
        return Err(DecodeError::Unsupported(header.to_owned()));
    }
    let mut body = body;
    for coding in codings.iter().rev() {
        body = match coding.as_str() {
            "zstd" => zstd(&body, limit)?,
            "gzip" | "x-gzip" => capped(
                flate2::read::MultiGzDecoder::new(body.as_slice()),
                limit,
                "gzip",
            )?,
            "deflate" => capped(
                flate2::read::ZlibDecoder::new(body.as_slice()),
                limit,
                "deflate",
            )?,
            other => return Err(DecodeError::Unsupported(other.to_owned())),
        };
    }
    Ok(body)
}

/// Reads `r` to the end, refusing to produce more than `limit` bytes.
fn capped<R: Read>(r: R, limit: usize, what: &'static str) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    r.take(cap)
        .read_to_end(&mut out)
        .map_err(|_| DecodeError::Malformed(what))?;
    if out.len() > limit {
        return Err(DecodeError::TooLarge);
    }
    Ok(out)
}

/// Decodes every zstd frame in `data` (skippable frames are skipped by the decoder).
fn zstd(data: &[u8], limit: usize) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let window = u64::try_from(limit).unwrap_or(u64::MAX).max(1 << 20);
        let mut dec =
            ruzstd::decoding::StreamingDecoder::new_with_max_window_size(&mut rest, window)
                .map_err(|_| DecodeError::Malformed("zstd"))?;
        let left = limit - out.len();
        let cap = u64::try_from(left).unwrap_or(u64::MAX).saturating_add(1);
        (&mut dec)
            .take(cap)
            .read_to_end(&mut out)
            .map_err(|_| DecodeError::Malformed("zstd"))?;
        if out.len() > limit {
            return Err(DecodeError::TooLarge);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn zst(data: &[u8]) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
    }

    #[test]
    fn codings_round_trip() {
        let json = br#"{"model":"gpt-5.5","input":"hi"}"#.repeat(500);
        assert_eq!(decode(None, json.clone(), 1 << 20).unwrap(), json);
        assert_eq!(
            decode(Some("identity"), json.clone(), 1 << 20).unwrap(),
            json
        );
        assert_eq!(decode(Some("zstd"), zst(&json), 1 << 20).unwrap(), json);
        assert_eq!(decode(Some("GZIP"), gzip(&json), 1 << 20).unwrap(), json);
        // Two frames back to back.
        let mut two = zst(&json[..100]);
        two.extend(zst(&json[100..]));
        assert_eq!(decode(Some("zstd"), two, 1 << 20).unwrap(), json);
        // Applied in order: gzip first, then zstd.
        assert_eq!(
            decode(Some("gzip, zstd"), zst(&gzip(&json)), 1 << 20).unwrap(),
            json
        );
    }

    #[test]
    fn bombs_stop_at_the_limit() {
        let zeros = vec![0u8; 64 << 20];
        let z = zst(&zeros);
        let g = gzip(&zeros);
        assert!(z.len() < 1 << 20 && g.len() < 1 << 20);
        assert_eq!(
            decode(Some("zstd"), z, 16 << 20),
            Err(DecodeError::TooLarge)
        );
        assert_eq!(
            decode(Some("gzip"), g, 16 << 20),
            Err(DecodeError::TooLarge)
        );
        // Exactly at the limit is fine.
        let exact = vec![7u8; 4096];
        assert_eq!(decode(Some("zstd"), zst(&exact), 4096).unwrap(), exact);
        assert_eq!(decode(Some("gzip"), gzip(&exact), 4096).unwrap(), exact);
    }

    #[test]
    fn bad_input_is_named() {
        assert_eq!(
            decode(Some("br"), b"x".to_vec(), 10),
            Err(DecodeError::Unsupported("br".into()))
        );
        assert_eq!(
            decode(Some("zstd"), b"not zstd".to_vec(), 10),
            Err(DecodeError::Malformed("zstd"))
        );
        assert_eq!(
            decode(Some("gzip"), b"not gzip".to_vec(), 10),
            Err(DecodeError::Malformed("gzip"))
        );
    }
}
