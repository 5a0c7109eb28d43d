//! `encoding`: request body content codings (`gateway::server::encoding::decode`: zstd,
//! gzip, deflate, and two of them stacked).
//!
//! Input: byte 0 picks the `Content-Encoding` (and, from its top bit, "round trip" mode),
//! byte 1 the limit (in 64-byte steps), the rest is the body. Invariants:
//! - decoding never yields more than the limit (a bomb is refused with 413 at the limit);
//! - round trip mode: the rest compressed with gzip or zlib-deflate (flate2), or zstd
//!   (ruzstd), decodes back to itself when it fits the limit and is refused as too large
//!   exactly when it does not.

use std::io::Write;

use gateway::server::encoding::{decode, DecodeError};

const CODINGS: [&str; 8] = [
    "zstd",
    "gzip",
    "deflate",
    "gzip, zstd",
    "x-gzip",
    "identity",
    "br",
    "zstd, deflate",
];

fn compress(coding: &str, data: &[u8]) -> Vec<u8> {
    let out = match coding {
        "gzip" | "x-gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(data).and_then(|()| e.finish())
        }
        "deflate" => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(data).and_then(|()| e.finish())
        }
        "zstd" => Ok(ruzstd::encoding::compress_to_vec(
            data,
            ruzstd::encoding::CompressionLevel::Fastest,
        )),
        _ => Ok(data.to_vec()),
    };
    out.unwrap_or_else(|e| panic!("compressing: {e}"))
}

/// The fuzz target.
pub fn run(data: &[u8]) {
    let [pick, limit, body @ ..] = data else {
        return;
    };
    let header = CODINGS[usize::from(pick & 7)];
    let limit = usize::from(*limit) * 64;
    if pick & 0x80 == 0 {
        if let Ok(out) = decode(Some(header), body.to_vec(), limit) {
            assert!(
                out.len() <= limit || header == "identity",
                "{} > {limit}",
                out.len()
            );
        }
        return;
    }
    // Round trip: encode in the header's order, decode.
    let codings: Vec<&str> = header.split(',').map(str::trim).collect();
    if codings.contains(&"br") {
        assert!(matches!(
            decode(Some(header), body.to_vec(), limit),
            Err(DecodeError::Unsupported(_))
        ));
        return;
    }
    let mut wire = body.to_vec();
    for c in &codings {
        wire = compress(c, &wire);
    }
    // Stacked codings: the inner result must fit the limit too.
    let got = decode(Some(header), wire, limit);
    if header == "identity" {
        assert_eq!(got, Ok(body.to_vec()));
    } else if body.len() <= limit
        && (codings.len() == 1 || compress(codings[0], body).len() <= limit)
    {
        assert_eq!(got, Ok(body.to_vec()), "{header} round trip");
    } else if body.len() > limit {
        assert_eq!(got, Err(DecodeError::TooLarge), "{header} over the limit");
    }
}
