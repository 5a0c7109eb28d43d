mod table;

use bytes::BytesMut;

use self::table::{DECODE_TABLE, ENCODE_TABLE};
use crate::h2::hpack::DecoderError;

// These flags must match the ones in genhuff.rs

const MAYBE_EOS: u8 = 1;
const DECODED: u8 = 2;
const ERROR: u8 = 4;

pub fn decode(src: &[u8], buf: &mut BytesMut) -> Result<BytesMut, DecoderError> {
    // codex-gateway patch (vendor/README.md, change 15): the symbols are written straight
    // into the reserved room (at most one per 4-bit step, so two per input byte), and the
    // state machine stays in locals; the published code called `put_u8` (a capacity check
    // and a length update) per symbol through an `Option`-returning step. Same table, same
    // errors, same output.
    //
    // Max compression ratio is >= 0.5
    buf.reserve(src.len() << 1);
    let out = &mut buf.spare_capacity_mut()[..src.len() << 1];
    let mut n = 0;
    // A state is below 256 (the table's rows), a `u8`: no bounds check on the lookups.
    let mut state: u8 = 0;
    let mut flags = 0;

    for &b in src {
        for nibble in [b >> 4, b & 0xf] {
            // (next-state, byte, flags)
            let (next, byte, f) = DECODE_TABLE[state as usize][nibble as usize];
            if f & ERROR == ERROR {
                // Data followed the EOS marker
                return Err(DecoderError::InvalidHuffmanCode);
            }
            if f & DECODED == DECODED {
                out[n].write(byte);
                n += 1;
            }
            state = next as u8;
            flags = f;
        }
    }

    // The last step's flags say whether what is left is a prefix of EOS (padding).
    let maybe_eos = flags & MAYBE_EOS == MAYBE_EOS;
    if !(state == 0 || maybe_eos) {
        return Err(DecoderError::InvalidHuffmanCode);
    }

    // SAFETY: the first `n` bytes of the spare room were written just above.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(buf.split())
}

/// The length in bytes of `src` Huffman-encoded, EOS padding included (codex-gateway
/// patch: lets the encoder write the string head before the string).
pub fn encoded_len(src: &[u8]) -> usize {
    let bits: usize = src.iter().map(|&b| ENCODE_TABLE[b as usize].0).sum();
    bits.div_ceil(8)
}

pub fn encode(src: &[u8], dst: &mut BytesMut) {
    // codex-gateway patch (vendor/README.md): 32 bits are written at a time (upstream wrote
    // one byte per `put_u8`); the bytes are the same.
    let mut bits: u64 = 0; // pending bits, from the top
    let mut n: usize = 0; // how many (< 32 between symbols; a code has at most 30)
    for &b in src {
        let (nbits, code) = ENCODE_TABLE[b as usize];
        bits |= code << (64 - n - nbits);
        n += nbits;
        if n >= 32 {
            dst.extend_from_slice(&((bits >> 32) as u32).to_be_bytes());
            bits <<= 32;
            n -= 32;
        }
    }
    if n > 0 {
        // The rest of the last byte is the start of EOS: ones.
        bits |= u64::MAX >> n;
        dst.extend_from_slice(&bits.to_be_bytes()[..n.div_ceil(8)]);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn decode(src: &[u8]) -> Result<BytesMut, DecoderError> {
        let mut buf = BytesMut::new();
        super::decode(src, &mut buf)
    }

    /// The published decoder (one `put_u8` per symbol), as the reference for change 15.
    fn reference_decode(src: &[u8]) -> Result<Vec<u8>, DecoderError> {
        let (mut state, mut maybe_eos, mut out) = (0, false, Vec::new());
        for b in src {
            for nibble in [b >> 4, b & 0xf] {
                let (next, byte, flags) = DECODE_TABLE[state][nibble as usize];
                if flags & ERROR == ERROR {
                    return Err(DecoderError::InvalidHuffmanCode);
                }
                if flags & DECODED == DECODED {
                    out.push(byte);
                }
                state = next;
                maybe_eos = flags & MAYBE_EOS == MAYBE_EOS;
            }
        }
        if state == 0 || maybe_eos {
            Ok(out)
        } else {
            Err(DecoderError::InvalidHuffmanCode)
        }
    }

    #[test]
    fn decode_table_states_fit_a_byte() {
        assert!(DECODE_TABLE
            .iter()
            .flatten()
            .all(|&(next, _, _)| next < 256));
    }

    #[test]
    fn decode_matches_the_published_decoder_on_valid_and_invalid_input() {
        // EOS inside the data, and padding that is not a prefix of EOS.
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xff]),
            Err(DecoderError::InvalidHuffmanCode)
        );
        assert_eq!(decode(&[0x00]), Err(DecoderError::InvalidHuffmanCode));
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        // One decoder buffer for all, as the HPACK decoder has.
        let mut buf = BytesMut::new();
        for i in 0..20_000 {
            let len = (next() % 64) as usize;
            let raw: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let src = if i % 2 == 0 {
                let mut enc = BytesMut::new();
                encode(&raw, &mut enc);
                enc.to_vec()
            } else {
                raw.clone()
            };
            let got = super::decode(&src, &mut buf).map(|b| b.to_vec());
            let want = reference_decode(&src);
            assert_eq!(got, want, "{src:?}");
            if i % 2 == 0 {
                assert_eq!(got.unwrap(), raw);
            }
        }
    }

    #[test]
    fn decode_single_byte() {
        assert_eq!("o", decode(&[0b00111111]).unwrap());
        assert_eq!("0", decode(&[7]).unwrap());
        assert_eq!("A", decode(&[(0x21 << 2) + 3]).unwrap());
    }

    #[test]
    fn single_char_multi_byte() {
        assert_eq!("#", decode(&[255, 160 + 15]).unwrap());
        assert_eq!("$", decode(&[255, 200 + 7]).unwrap());
        assert_eq!("\x0a", decode(&[255, 255, 255, 240 + 3]).unwrap());
    }

    #[test]
    fn multi_char() {
        assert_eq!("!0", decode(&[254, 1]).unwrap());
        assert_eq!(" !", decode(&[0b01010011, 0b11111000]).unwrap());
    }

    #[test]
    fn encode_single_byte() {
        let mut dst = BytesMut::with_capacity(1);

        encode(b"o", &mut dst);
        assert_eq!(&dst[..], &[0b00111111]);

        dst.clear();
        encode(b"0", &mut dst);
        assert_eq!(&dst[..], &[7]);

        dst.clear();
        encode(b"A", &mut dst);
        assert_eq!(&dst[..], &[(0x21 << 2) + 3]);
    }

    #[test]
    fn encode_decode_str() {
        const DATA: &[&str] = &[
            "hello world",
            ":method",
            ":scheme",
            ":authority",
            "yahoo.co.jp",
            "GET",
            "http",
            ":path",
            "/images/top/sp2/cmn/logo-ns-130528.png",
            "example.com",
            "hpack-test",
            "xxxxxxx1",
            "Mozilla/5.0 (Macintosh; Intel Mac OS X 10.8; rv:16.0) Gecko/20100101 Firefox/16.0",
            "accept",
            "Accept",
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
            "cookie",
            "B=76j09a189a6h4&b=3&s=0b",
            "TE",
            "Lorem ipsum dolor sit amet, consectetur adipiscing elit. Morbi non bibendum libero. \
             Etiam ultrices lorem ut.",
        ];

        for s in DATA {
            let mut dst = BytesMut::with_capacity(s.len());

            encode(s.as_bytes(), &mut dst);

            let decoded = decode(&dst).unwrap();

            assert_eq!(&decoded[..], s.as_bytes());
        }
    }

    #[test]
    fn encode_decode_u8() {
        const DATA: &[&[u8]] = &[b"\0", b"\0\0\0", b"\0\x01\x02\x03\x04\x05", b"\xFF\xF8"];

        for s in DATA {
            let mut dst = BytesMut::with_capacity(s.len());

            encode(s, &mut dst);

            let decoded = decode(&dst).unwrap();

            assert_eq!(&decoded[..], &s[..]);
        }
    }
}
