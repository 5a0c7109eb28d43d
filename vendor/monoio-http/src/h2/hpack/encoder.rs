use bytes::{BufMut, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};

use super::{
    huffman,
    table::{Index, Table, DYN_OFFSET},
    Header,
};

#[derive(Debug)]
pub struct Encoder {
    table: Table,
    size_update: Option<SizeUpdate>,
    /// codex-gateway patch (vendor/README.md, change 5): regular fields this encoder found
    /// in or inserted into its dynamic table, with the entry's id (`Table::id_at`). A client
    /// sends the same fields (user agent, originator, account, accept, ...) on every request
    /// of a connection: a field found here whose entry is still in the table is sent as that
    /// index without hashing and probing the table again. The bytes are the ones the table
    /// lookup would choose.
    memo: Vec<Memo>,
    /// Where the next lookup in `memo` starts (fields repeat in the same order).
    memo_next: usize,
    /// codex-gateway patch (vendor/README.md, change 11): the `:authority` of the last
    /// request, with its dynamic table entry id (as `memo`: sent as that index while the
    /// entry is live).
    authority: Option<(Bytes, usize)>,
    /// codex-gateway patch (change 11): the `:path` of the last request and its encoded
    /// representation. HPACK never indexes a path (a literal with the static name index
    /// and the Huffman-coded value), so its bytes depend on the value alone; a client sends
    /// the same path on every request of a connection.
    path: Option<(Bytes, Vec<u8>)>,
}

/// How a field's name was sent (`Encoder::encode_fields`).
#[derive(Clone, Copy)]
enum PrevName {
    /// As (part of) this table index.
    Index(usize),
    /// As a literal.
    Literal,
}

#[derive(Debug)]
struct Memo {
    name: HeaderName,
    value: HeaderValue,
    id: usize,
}

/// At most this many remembered fields (a request head's worth); a full memo starts over.
const MEMO_MAX: usize = 32;

/// `:path` in the static table (RFC 7541, appendix A).
const PATH_INDEX: usize = 4;

#[derive(Debug, Copy, Clone, Eq, PartialEq)]
enum SizeUpdate {
    One(usize),
    Two(usize, usize), // min, max
}

impl Encoder {
    pub fn new(max_size: usize, capacity: usize) -> Encoder {
        Encoder {
            table: Table::new(max_size, capacity),
            size_update: None,
            memo: Vec::new(),
            memo_next: 0,
            authority: None,
            path: None,
        }
    }

    /// Queues a max size update.
    ///
    /// The next call to `encode` will include a dynamic size update frame.
    pub fn update_max_size(&mut self, val: usize) {
        match self.size_update {
            Some(SizeUpdate::One(old)) => {
                if val > old {
                    if old > self.table.max_size() {
                        self.size_update = Some(SizeUpdate::One(val));
                    } else {
                        self.size_update = Some(SizeUpdate::Two(old, val));
                    }
                } else {
                    self.size_update = Some(SizeUpdate::One(val));
                }
            }
            Some(SizeUpdate::Two(min, _)) => {
                if val < min {
                    self.size_update = Some(SizeUpdate::One(val));
                } else {
                    self.size_update = Some(SizeUpdate::Two(min, val));
                }
            }
            None => {
                if val != self.table.max_size() {
                    // Don't bother writing a frame if the value already matches
                    // the table's max size.
                    self.size_update = Some(SizeUpdate::One(val));
                }
            }
        }
    }

    /// Encode a set of headers into the provide buffer
    pub fn encode<I>(&mut self, headers: I, dst: &mut BytesMut)
    where
        I: IntoIterator<Item = Header<Option<HeaderName>>>,
    {
        self.encode_size_updates(dst);

        let mut last_index = None;

        for header in headers {
            match header.reify() {
                // The header has an associated name. In which case, try to
                // index it in the table.
                Ok(header) => {
                    if let Some(idx) = self.memo_hit(&header) {
                        encode_int(idx, 7, 0x80, dst);
                        last_index = Some(Index::Indexed(idx, header));
                        continue;
                    }
                    if let Header::Path(ref v) = header {
                        if let Some((ref path, ref encoded)) = self.path {
                            if same_bytes(path, v.as_ref()) {
                                dst.extend_from_slice(encoded);
                                last_index = Some(Index::Name(PATH_INDEX, header));
                                continue;
                            }
                        }
                    }
                    let index = self.table.index(header);
                    self.memo_record(&index);
                    let start = dst.len();
                    self.encode_header(&index, dst);
                    if let Index::Name(PATH_INDEX, Header::Path(ref v)) = index {
                        self.path = Some((v.clone().into_inner(), dst[start..].to_vec()));
                    }

                    last_index = Some(index);
                }
                // The header does not have an associated name. This means that
                // the name is the same as the previously yielded header. In
                // which case, we skip table lookup and just use the same index
                // as the previous entry.
                Err(value) => {
                    self.encode_header_without_name(
                        last_index.as_ref().unwrap_or_else(|| {
                            panic!(
                                "encoding header without name, but no previous index to use for \
                                 name"
                            );
                        }),
                        &value,
                        dst,
                    );
                }
            }
        }
    }

    /// Encodes `pseudo` (pseudo-header fields: each has a name) and then `fields` into
    /// `dst`: the bytes `encode` gives for the same fields, a name equal to the previous
    /// field's yielded as `None`.
    ///
    /// codex-gateway patch (vendor/README.md, change 16): the regular fields are read in
    /// place. `encode` takes each field as an owned `Header` (moved out of the list, moved
    /// again to be reified, dropped after), although a field sent as its remembered index
    /// (every constant field of a request after the first) needs no more than a look.
    pub fn encode_fields<I>(
        &mut self,
        pseudo: I,
        fields: &[(HeaderName, HeaderValue)],
        dst: &mut BytesMut,
    ) where
        I: IntoIterator<Item = Header<Option<HeaderName>>>,
    {
        // Pseudo-header fields first (with any table size update), as `encode` does.
        self.encode(pseudo, dst);

        // How the previous field's name was sent, for a field of the same name.
        let mut prev: Option<PrevName> = None;
        for (i, (name, value)) in fields.iter().enumerate() {
            if i > 0 && fields[i - 1].0 == *name {
                match prev {
                    Some(PrevName::Index(idx)) => {
                        encode_not_indexed(idx, value.as_ref(), value.is_sensitive(), dst)
                    }
                    _ => encode_not_indexed2(
                        name.as_str().as_bytes(),
                        value.as_ref(),
                        value.is_sensitive(),
                        dst,
                    ),
                }
                continue;
            }
            if let Some(idx) = self.memo_hit_field(name, value) {
                encode_int(idx, 7, 0x80, dst);
                prev = Some(PrevName::Index(idx));
                continue;
            }
            let index = self.table.index(Header::Field {
                name: name.clone(),
                value: value.clone(),
            });
            self.memo_record(&index);
            self.encode_header(&index, dst);
            prev = Some(match index {
                Index::NotIndexed(_) => PrevName::Literal,
                ref index => PrevName::Index(self.table.resolve_idx(index)),
            });
        }
    }

    /// The live dynamic-table index of a regular field remembered in `memo` (or of the
    /// `:authority` remembered in `authority`).
    fn memo_hit(&mut self, header: &Header) -> Option<usize> {
        match header {
            Header::Field { name, value } => self.memo_hit_field(name, value),
            Header::Authority(v) => {
                let (ref authority, id) = *self.authority.as_ref()?;
                if !same_bytes(authority, v.as_ref()) {
                    return None;
                }
                let idx = self.table.live_index(id);
                if idx.is_none() {
                    self.authority = None;
                }
                idx
            }
            _ => None,
        }
    }

    /// The live dynamic-table index of a regular field remembered in `memo`.
    fn memo_hit_field(&mut self, name: &HeaderName, value: &HeaderValue) -> Option<usize> {
        if value.is_sensitive() || self.memo.is_empty() {
            return None;
        }
        let n = self.memo.len();
        let mut j = self.memo_next.min(n - 1);
        for _ in 0..n {
            let m = &self.memo[j];
            // The value first: a field remembered shares its bytes (a pointer compare), and
            // a field that is never remembered (a content length) differs in length.
            if !same_bytes(m.value.as_bytes(), value.as_bytes()) || !same_name(&m.name, name) {
                j += 1;
                if j == n {
                    j = 0;
                }
                continue;
            }
            return match self.table.live_index(m.id) {
                Some(idx) => {
                    self.memo_next = j + 1;
                    Some(idx)
                }
                None => {
                    // Evicted: forget it; the table decides (and may insert it again).
                    self.memo.swap_remove(j);
                    None
                }
            };
        }
        None
    }

    /// Remembers a regular field the table lookup found in or put into the dynamic table.
    fn memo_record(&mut self, index: &Index) {
        let real_idx = match *index {
            Index::Indexed(idx, _) if idx >= DYN_OFFSET => idx - DYN_OFFSET,
            Index::Inserted(real_idx) | Index::InsertedValue(_, real_idx) => real_idx,
            _ => return,
        };
        let (name, value) = match self.table.resolve(index) {
            Header::Field { name, value } => (name, value),
            Header::Authority(v) => {
                self.authority = Some((v.clone().into_inner(), self.table.id_at(real_idx)));
                return;
            }
            _ => return,
        };
        if value.is_sensitive() {
            return;
        }
        if self.memo.len() >= MEMO_MAX {
            self.memo.clear();
        }
        self.memo.push(Memo {
            name: name.clone(),
            value: value.clone(),
            id: self.table.id_at(real_idx),
        });
    }

    fn encode_size_updates(&mut self, dst: &mut BytesMut) {
        match self.size_update.take() {
            Some(SizeUpdate::One(val)) => {
                self.table.resize(val);
                encode_size_update(val, dst);
            }
            Some(SizeUpdate::Two(min, max)) => {
                self.table.resize(min);
                self.table.resize(max);
                encode_size_update(min, dst);
                encode_size_update(max, dst);
            }
            None => {}
        }
    }

    fn encode_header(&mut self, index: &Index, dst: &mut BytesMut) {
        match *index {
            Index::Indexed(idx, _) => {
                encode_int(idx, 7, 0x80, dst);
            }
            Index::Name(idx, _) => {
                let header = self.table.resolve(index);

                encode_not_indexed(idx, header.value_slice(), header.is_sensitive(), dst);
            }
            Index::Inserted(_) => {
                let header = self.table.resolve(index);

                assert!(!header.is_sensitive());

                dst.put_u8(0b0100_0000);

                encode_str(header.name().as_slice(), dst);
                encode_str(header.value_slice(), dst);
            }
            Index::InsertedValue(idx, _) => {
                let header = self.table.resolve(index);

                assert!(!header.is_sensitive());

                encode_int(idx, 6, 0b0100_0000, dst);
                encode_str(header.value_slice(), dst);
            }
            Index::NotIndexed(_) => {
                let header = self.table.resolve(index);

                encode_not_indexed2(
                    header.name().as_slice(),
                    header.value_slice(),
                    header.is_sensitive(),
                    dst,
                );
            }
        }
    }

    fn encode_header_without_name(
        &mut self,
        last: &Index,
        value: &HeaderValue,
        dst: &mut BytesMut,
    ) {
        match *last {
            Index::Indexed(..)
            | Index::Name(..)
            | Index::Inserted(..)
            | Index::InsertedValue(..) => {
                let idx = self.table.resolve_idx(last);

                encode_not_indexed(idx, value.as_ref(), value.is_sensitive(), dst);
            }
            Index::NotIndexed(_) => {
                let last = self.table.resolve(last);

                encode_not_indexed2(
                    last.name().as_slice(),
                    value.as_ref(),
                    value.is_sensitive(),
                    dst,
                );
            }
        }
    }
}

impl Default for Encoder {
    fn default() -> Encoder {
        Encoder::new(4096, 0)
    }
}

/// Equal bytes; a value cloned from the same `HeaderValue` shares them (no compare).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    (a.as_ptr() == b.as_ptr() && a.len() == b.len()) || a == b
}

/// Equal names; the same standard name or the same static custom one has the same text
/// (no compare).
fn same_name(a: &HeaderName, b: &HeaderName) -> bool {
    same_bytes(a.as_str().as_bytes(), b.as_str().as_bytes())
}

fn encode_size_update(val: usize, dst: &mut BytesMut) {
    encode_int(val, 5, 0b0010_0000, dst)
}

fn encode_not_indexed(name: usize, value: &[u8], sensitive: bool, dst: &mut BytesMut) {
    if sensitive {
        encode_int(name, 4, 0b10000, dst);
    } else {
        encode_int(name, 4, 0, dst);
    }

    encode_str(value, dst);
}

fn encode_not_indexed2(name: &[u8], value: &[u8], sensitive: bool, dst: &mut BytesMut) {
    if sensitive {
        dst.put_u8(0b10000);
    } else {
        dst.put_u8(0);
    }

    encode_str(name, dst);
    encode_str(value, dst);
}

/// codex-gateway patch (vendor/README.md, change 3): strings longer than this are sent as raw
/// literals (RFC 7541 §5.2 leaves the choice to the encoder). Huffman coding saves about a
/// quarter of a token's bytes but costs a table lookup and a bit shuffle per byte, on every
/// request for a value HPACK never indexes (the `authorization` bearer token, 1-2 KB).
const HUFFMAN_MAX: usize = 256;

fn encode_str(val: &[u8], dst: &mut BytesMut) {
    if val.len() > HUFFMAN_MAX {
        dst.reserve(val.len() + 8);
        encode_int(val.len(), 7, 0, dst);
        dst.extend_from_slice(val);
    } else if !val.is_empty() {
        // codex-gateway patch (vendor/README.md): the Huffman length is computed first, so
        // the string head and then the encoded bytes are written in place. Upstream encoded
        // first and, when the head took more than one byte (every value of 127 encoded
        // bytes or more, e.g. a bearer token), shifted the encoded bytes one at a time.
        // The bytes produced are the same.
        let huff_len = huffman::encoded_len(val);
        dst.reserve(huff_len + 8);
        encode_int(huff_len, 7, 0x80, dst);
        huffman::encode(val, dst);
    } else {
        // Write an empty string
        dst.put_u8(0);
    }
}

/// Encode an integer into the given destination buffer
fn encode_int<B: BufMut>(
    mut value: usize,   // The integer to encode
    prefix_bits: usize, // The number of bits in the prefix
    first_byte: u8,     // The base upon which to start encoding the int
    dst: &mut B,
) {
    if encode_int_one_byte(value, prefix_bits) {
        dst.put_u8(first_byte | value as u8);
        return;
    }

    let low = (1 << prefix_bits) - 1;

    value -= low;

    dst.put_u8(first_byte | low as u8);

    while value >= 128 {
        dst.put_u8(0b1000_0000 | value as u8);

        value >>= 7;
    }

    dst.put_u8(value as u8);
}

/// Returns true if the in the int can be fully encoded in the first byte.
fn encode_int_one_byte(value: usize, prefix_bits: usize) -> bool {
    value < (1 << prefix_bits) - 1
}

#[cfg(test)]
mod test {
    use http::*;

    use super::{super::BytesStr, *};

    #[test]
    fn test_encode_method_get() {
        let mut encoder = Encoder::default();
        let res = encode(&mut encoder, vec![method("GET")]);
        assert_eq!(*res, [0x80 | 2]);
        assert_eq!(encoder.table.len(), 0);
    }

    #[test]
    fn test_encode_method_post() {
        let mut encoder = Encoder::default();
        let res = encode(&mut encoder, vec![method("POST")]);
        assert_eq!(*res, [0x80 | 3]);
        assert_eq!(encoder.table.len(), 0);
    }

    #[test]
    fn test_encode_method_patch() {
        let mut encoder = Encoder::default();
        let res = encode(&mut encoder, vec![method("PATCH")]);

        assert_eq!(res[0], 0b01000000 | 2); // Incremental indexing w/ name pulled from table
        assert_eq!(res[1], 0x80 | 5); // header value w/ huffman coding

        assert_eq!("PATCH", huff_decode(&res[2..7]));
        assert_eq!(encoder.table.len(), 1);

        let res = encode(&mut encoder, vec![method("PATCH")]);

        assert_eq!(1 << 7 | 62, res[0]);
        assert_eq!(1, res.len());
    }

    #[test]
    fn test_encode_indexed_name_literal_value() {
        let mut encoder = Encoder::default();
        let res = encode(&mut encoder, vec![header("content-language", "foo")]);

        assert_eq!(res[0], 0b01000000 | 27); // Indexed name
        assert_eq!(res[1], 0x80 | 2); // header value w/ huffman coding

        assert_eq!("foo", huff_decode(&res[2..4]));

        // Same name, new value should still use incremental
        let res = encode(&mut encoder, vec![header("content-language", "bar")]);
        assert_eq!(res[0], 0b01000000 | 27); // Indexed name
        assert_eq!(res[1], 0x80 | 3); // header value w/ huffman coding
        assert_eq!("bar", huff_decode(&res[2..5]));
    }

    #[test]
    fn test_repeated_headers_are_indexed() {
        let mut encoder = Encoder::default();
        let res = encode(&mut encoder, vec![header("foo", "hello")]);

        assert_eq!(&[0b01000000, 0x80 | 2], &res[0..2]);
        assert_eq!("foo", huff_decode(&res[2..4]));
        assert_eq!(0x80 | 4, res[4]);
        assert_eq!("hello", huff_decode(&res[5..]));
        assert_eq!(9, res.len());

        assert_eq!(1, encoder.table.len());

        let res = encode(&mut encoder, vec![header("foo", "hello")]);
        assert_eq!([0x80 | 62], *res);

        assert_eq!(encoder.table.len(), 1);
    }

    #[test]
    fn test_evicting_headers() {
        let mut encoder = Encoder::default();

        // Fill the table
        for i in 0..64 {
            let key = format!("x-hello-world-{:02}", i);
            let res = encode(&mut encoder, vec![header(&key, &key)]);

            assert_eq!(&[0b01000000, 0x80 | 12], &res[0..2]);
            assert_eq!(key, huff_decode(&res[2..14]));
            assert_eq!(0x80 | 12, res[14]);
            assert_eq!(key, huff_decode(&res[15..]));
            assert_eq!(27, res.len());

            // Make sure the header can be found...
            let res = encode(&mut encoder, vec![header(&key, &key)]);

            // Only check that it is found
            assert_eq!(0x80, res[0] & 0x80);
        }

        assert_eq!(4096, encoder.table.size());
        assert_eq!(64, encoder.table.len());

        // Find existing headers
        for i in 0..64 {
            let key = format!("x-hello-world-{:02}", i);
            let res = encode(&mut encoder, vec![header(&key, &key)]);
            assert_eq!(0x80, res[0] & 0x80);
        }

        // Insert a new header
        let key = "x-hello-world-64";
        let res = encode(&mut encoder, vec![header(key, key)]);

        assert_eq!(&[0b01000000, 0x80 | 12], &res[0..2]);
        assert_eq!(key, huff_decode(&res[2..14]));
        assert_eq!(0x80 | 12, res[14]);
        assert_eq!(key, huff_decode(&res[15..]));
        assert_eq!(27, res.len());

        assert_eq!(64, encoder.table.len());

        // Now try encoding entries that should exist in the table
        for i in 1..65 {
            let key = format!("x-hello-world-{:02}", i);
            let res = encode(&mut encoder, vec![header(&key, &key)]);
            assert_eq!(0x80 | (61 + (65 - i)), res[0]);
        }
    }

    #[test]
    fn test_large_headers_are_not_indexed() {
        let mut encoder = Encoder::new(128, 0);
        let key = "hello-world-hello-world-HELLO-zzz";

        let res = encode(&mut encoder, vec![header(key, key)]);

        assert_eq!(&[0, 0x80 | 25], &res[..2]);

        assert_eq!(0, encoder.table.len());
        assert_eq!(0, encoder.table.size());
    }

    #[test]
    fn test_sensitive_headers_are_never_indexed() {
        use http::header::HeaderValue;

        let name = "my-password".parse().unwrap();
        let mut value = HeaderValue::from_bytes(b"12345").unwrap();
        value.set_sensitive(true);

        let header = Header::Field {
            name: Some(name),
            value,
        };

        // Now, try to encode the sensitive header

        let mut encoder = Encoder::default();
        let res = encode(&mut encoder, vec![header]);

        assert_eq!(&[0b10000, 0x80 | 8], &res[..2]);
        assert_eq!("my-password", huff_decode(&res[2..10]));
        assert_eq!(0x80 | 4, res[10]);
        assert_eq!("12345", huff_decode(&res[11..]));

        // Now, try to encode a sensitive header w/ a name in the static table
        let name = "authorization".parse().unwrap();
        let mut value = HeaderValue::from_bytes(b"12345").unwrap();
        value.set_sensitive(true);

        let header = Header::Field {
            name: Some(name),
            value,
        };

        let mut encoder = Encoder::default();
        let res = encode(&mut encoder, vec![header]);

        assert_eq!(&[0b11111, 8], &res[..2]);
        assert_eq!(0x80 | 4, res[2]);
        assert_eq!("12345", huff_decode(&res[3..]));

        // Using the name component of a previously indexed header (without
        // sensitive flag set)

        let _ = encode(
            &mut encoder,
            vec![self::header("my-password", "not-so-secret")],
        );

        let name = "my-password".parse().unwrap();
        let mut value = HeaderValue::from_bytes(b"12345").unwrap();
        value.set_sensitive(true);

        let header = Header::Field {
            name: Some(name),
            value,
        };
        let res = encode(&mut encoder, vec![header]);

        assert_eq!(&[0b11111, 47], &res[..2]);
        assert_eq!(0x80 | 4, res[2]);
        assert_eq!("12345", huff_decode(&res[3..]));
    }

    #[test]
    fn test_content_length_value_not_indexed() {
        let mut encoder = Encoder::default();
        let res = encode(&mut encoder, vec![header("content-length", "1234")]);

        assert_eq!(&[15, 13, 0x80 | 3], &res[0..3]);
        assert_eq!("1234", huff_decode(&res[3..]));
        assert_eq!(6, res.len());
    }

    #[test]
    fn test_encoding_headers_with_same_name() {
        let mut encoder = Encoder::default();
        let name = "hello";

        // Encode first one
        let _ = encode(&mut encoder, vec![header(name, "one")]);

        // Encode second one
        let res = encode(&mut encoder, vec![header(name, "two")]);
        assert_eq!(&[0x40 | 62, 0x80 | 3], &res[0..2]);
        assert_eq!("two", huff_decode(&res[2..]));
        assert_eq!(5, res.len());

        // Encode the first one again
        let res = encode(&mut encoder, vec![header(name, "one")]);
        assert_eq!(&[0x80 | 63], &res[..]);

        // Now the second one
        let res = encode(&mut encoder, vec![header(name, "two")]);
        assert_eq!(&[0x80 | 62], &res[..]);
    }

    #[test]
    fn test_evicting_headers_when_multiple_of_same_name_are_in_table() {
        // The encoder only has space for 2 headers
        let mut encoder = Encoder::new(76, 0);

        let _ = encode(&mut encoder, vec![header("foo", "bar")]);
        assert_eq!(1, encoder.table.len());

        let _ = encode(&mut encoder, vec![header("bar", "foo")]);
        assert_eq!(2, encoder.table.len());

        // This will evict the first header, while still referencing the header
        // name
        let res = encode(&mut encoder, vec![header("foo", "baz")]);
        assert_eq!(&[0x40 | 63, 0, 0x80 | 3], &res[..3]);
        assert_eq!(2, encoder.table.len());

        // Try adding the same header again
        let res = encode(&mut encoder, vec![header("foo", "baz")]);
        assert_eq!(&[0x80 | 62], &res[..]);
        assert_eq!(2, encoder.table.len());
    }

    #[test]
    fn test_max_size_zero() {
        // Static table only
        let mut encoder = Encoder::new(0, 0);
        let res = encode(&mut encoder, vec![method("GET")]);
        assert_eq!(*res, [0x80 | 2]);
        assert_eq!(encoder.table.len(), 0);

        let res = encode(&mut encoder, vec![header("foo", "bar")]);
        assert_eq!(&[0, 0x80 | 2], &res[..2]);
        assert_eq!("foo", huff_decode(&res[2..4]));
        assert_eq!(0x80 | 3, res[4]);
        assert_eq!("bar", huff_decode(&res[5..8]));
        assert_eq!(0, encoder.table.len());

        // Encode a custom value
        let res = encode(&mut encoder, vec![header("transfer-encoding", "chunked")]);
        assert_eq!(&[15, 42, 0x80 | 6], &res[..3]);
        assert_eq!("chunked", huff_decode(&res[3..]));
    }

    #[test]
    fn test_update_max_size_combos() {
        let mut encoder = Encoder::default();
        assert!(encoder.size_update.is_none());
        assert_eq!(4096, encoder.table.max_size());

        encoder.update_max_size(4096); // Default size
        assert!(encoder.size_update.is_none());

        encoder.update_max_size(0);
        assert_eq!(Some(SizeUpdate::One(0)), encoder.size_update);

        encoder.update_max_size(100);
        assert_eq!(Some(SizeUpdate::Two(0, 100)), encoder.size_update);

        let mut encoder = Encoder::default();
        encoder.update_max_size(8000);
        assert_eq!(Some(SizeUpdate::One(8000)), encoder.size_update);

        encoder.update_max_size(100);
        assert_eq!(Some(SizeUpdate::One(100)), encoder.size_update);

        encoder.update_max_size(8000);
        assert_eq!(Some(SizeUpdate::Two(100, 8000)), encoder.size_update);

        encoder.update_max_size(4000);
        assert_eq!(Some(SizeUpdate::Two(100, 4000)), encoder.size_update);

        encoder.update_max_size(50);
        assert_eq!(Some(SizeUpdate::One(50)), encoder.size_update);
    }

    #[test]
    fn test_resizing_table() {
        let mut encoder = Encoder::default();

        // Add a header
        let _ = encode(&mut encoder, vec![header("foo", "bar")]);

        encoder.update_max_size(1);
        assert_eq!(1, encoder.table.len());

        let res = encode(&mut encoder, vec![method("GET")]);
        assert_eq!(&[32 | 1, 0x80 | 2], &res[..]);
        assert_eq!(0, encoder.table.len());

        let res = encode(&mut encoder, vec![header("foo", "bar")]);
        assert_eq!(0, res[0]);

        encoder.update_max_size(100);
        let res = encode(&mut encoder, vec![header("foo", "bar")]);
        assert_eq!(&[32 | 31, 69, 64], &res[..3]);

        encoder.update_max_size(0);
        let res = encode(&mut encoder, vec![header("foo", "bar")]);
        assert_eq!(&[32, 0], &res[..2]);
    }

    #[test]
    fn test_decreasing_table_size_without_eviction() {
        let mut encoder = Encoder::default();

        // Add a header
        let _ = encode(&mut encoder, vec![header("foo", "bar")]);

        encoder.update_max_size(100);
        assert_eq!(1, encoder.table.len());

        let res = encode(&mut encoder, vec![header("foo", "bar")]);
        assert_eq!(&[32 | 31, 69, 0x80 | 62], &res[..]);
    }

    #[test]
    fn test_nameless_header() {
        let mut encoder = Encoder::default();

        let res = encode(
            &mut encoder,
            vec![
                Header::Field {
                    name: Some("hello".parse().unwrap()),
                    value: HeaderValue::from_bytes(b"world").unwrap(),
                },
                Header::Field {
                    name: None,
                    value: HeaderValue::from_bytes(b"zomg").unwrap(),
                },
            ],
        );

        assert_eq!(&[0x40, 0x80 | 4], &res[0..2]);
        assert_eq!("hello", huff_decode(&res[2..6]));
        assert_eq!(0x80 | 4, res[6]);
        assert_eq!("world", huff_decode(&res[7..11]));

        // Next is not indexed
        assert_eq!(&[15, 47, 0x80 | 3], &res[11..14]);
        assert_eq!("zomg", huff_decode(&res[14..]));
    }

    #[test]
    fn test_large_size_update() {
        let mut encoder = Encoder::default();

        encoder.update_max_size(1912930560);
        assert_eq!(Some(SizeUpdate::One(1912930560)), encoder.size_update);

        let mut dst = BytesMut::with_capacity(6);
        encoder.encode_size_updates(&mut dst);
        assert_eq!([63, 225, 129, 148, 144, 7], &dst[..]);
    }

    #[test]
    #[ignore]
    fn test_evicted_overflow() {
        // Not sure what the best way to do this is.
    }

    // ===== codex-gateway patch: the memo of indexed fields (vendor/README.md, change 5) =====

    fn constant_fields() -> Vec<Header<Option<HeaderName>>> {
        vec![
            header("originator", "codex_cli_rs"),
            header("user-agent", "codex_cli_rs/0.99.0"),
            header("chatgpt-account-id", "acct-1"),
        ]
    }

    #[test]
    fn repeated_fields_are_sent_as_their_dynamic_index() {
        let mut encoder = Encoder::default();
        let first = encode(&mut encoder, constant_fields());
        assert_eq!(first[0], 0b0100_0000, "inserted with a literal name");
        assert_eq!(encoder.table.len(), 3);
        // Newest first: chatgpt-account-id 62, user-agent 63, originator 64.
        for _ in 0..3 {
            let again = encode(&mut encoder, constant_fields());
            assert_eq!(&again[..], &[0x80 | 64, 0x80 | 63, 0x80 | 62]);
            assert_eq!(encoder.table.len(), 3);
        }
        assert_eq!(encoder.memo.len(), 3);
        // A new value of a remembered name is not a hit: inserted, and the old entries move.
        let changed = encode(&mut encoder, vec![header("originator", "other")]);
        // Literal with incremental indexing, name index 64 (6-bit prefix: 63 + 1).
        assert_eq!(
            &changed[..2],
            &[0b0111_1111, 1],
            "name from the table, new value"
        );
        let again = encode(&mut encoder, constant_fields());
        assert_eq!(&again[..], &[0x80 | 65, 0x80 | 64, 0x80 | 63]);
    }

    #[test]
    fn an_evicted_field_is_inserted_again_not_sent_as_a_stale_index() {
        let mut encoder = Encoder::default();
        let mut decoder = super::super::Decoder::new(4096);
        let mut check = |encoder: &mut Encoder, hdrs: Vec<Header<Option<HeaderName>>>| {
            let sent: Vec<_> = hdrs
                .iter()
                .map(|h| match h {
                    Header::Field { name, value } => (name.clone().unwrap(), value.clone()),
                    _ => unreachable!(),
                })
                .collect();
            let mut dst = encode(encoder, hdrs);
            // The decoder consumes its input.
            let sent_bytes = dst.clone();
            let mut got = Vec::new();
            decoder
                .decode(&mut std::io::Cursor::new(&mut dst), |h| {
                    if let Header::Field { name, value } = h {
                        got.push((name, value));
                    }
                })
                .unwrap();
            assert_eq!(sent, got);
            sent_bytes
        };
        check(&mut encoder, constant_fields());
        // Fill the 4 KiB table with other entries: the constant fields are evicted.
        for i in 0..40 {
            check(
                &mut encoder,
                vec![header("x-filler", &format!("{i}-{}", "f".repeat(100)))],
            );
        }
        let again = check(&mut encoder, constant_fields());
        assert_eq!(again[0], 0b0100_0000, "inserted again with a literal name");
        let again = check(&mut encoder, constant_fields());
        assert_eq!(&again[..], &[0x80 | 64, 0x80 | 63, 0x80 | 62]);
        // SETTINGS_HEADER_TABLE_SIZE 0 empties the table: no index may be sent.
        encoder.update_max_size(0);
        let after = check(&mut encoder, constant_fields());
        assert_eq!(after[0], 0x20, "size update first");
        assert_eq!(after[1], 0, "a literal without indexing, literal name");
        assert_eq!(encoder.table.len(), 0);
        encoder.update_max_size(4096);
        let after = check(&mut encoder, constant_fields());
        assert_eq!(after[0], 0x3f, "size update first");
        let again = check(&mut encoder, constant_fields());
        assert_eq!(&again[..], &[0x80 | 64, 0x80 | 63, 0x80 | 62]);
    }

    /// codex-gateway patch (change 11): a request's pseudo-header fields, the path and
    /// authority remembered per connection.
    fn request(authority: &str, path: &str) -> Vec<Header<Option<HeaderName>>> {
        vec![
            method("POST"),
            Header::Scheme(BytesStr::from_static("https")),
            Header::Authority(BytesStr::from(authority)),
            Header::Path(BytesStr::from(path)),
            header("content-type", "application/json"),
        ]
    }

    #[test]
    fn a_repeated_path_and_authority_encode_as_the_table_would() {
        let mut encoder = Encoder::default();
        let mut decoder = super::super::Decoder::new(4096);
        let mut check = |encoder: &mut Encoder, hdrs: Vec<Header<Option<HeaderName>>>| {
            let sent: Vec<Header> = hdrs.iter().map(|h| h.clone().reify().unwrap()).collect();
            let mut dst = encode(encoder, hdrs);
            let sent_bytes = dst.clone();
            let mut got = Vec::new();
            decoder
                .decode(&mut std::io::Cursor::new(&mut dst), |h| got.push(h))
                .unwrap();
            assert_eq!(sent, got);
            sent_bytes
        };
        let path = "/backend-api/codex/responses";
        // The path's representation: a literal without indexing, name index 4, the value
        // Huffman-coded (the table lookup's choice, every time).
        let mut path_bytes = BytesMut::new();
        encode_not_indexed(4, path.as_bytes(), false, &mut path_bytes);

        let first = check(&mut encoder, request("chatgpt.com", path));
        // :method POST (3), :scheme https (7), then :authority inserted (name index 1).
        assert_eq!(&first[..3], &[0x80 | 3, 0x80 | 7, 0b0100_0000 | 1]);
        let again = check(&mut encoder, request("chatgpt.com", path));
        let mut expected = vec![0x80 | 3, 0x80 | 7, 0x80 | 63];
        expected.extend_from_slice(&path_bytes);
        expected.push(0x80 | 62);
        assert_eq!(&again[..], &expected[..]);
        // Another path, then the first one again: each as the table lookup encodes it.
        let other = check(&mut encoder, request("chatgpt.com", "/backend-api/other"));
        let mut other_path = BytesMut::new();
        encode_not_indexed(4, b"/backend-api/other", false, &mut other_path);
        assert_eq!(&other[3..3 + other_path.len()], &other_path[..]);
        assert_eq!(check(&mut encoder, request("chatgpt.com", path)), again);
        // The root path is in the static table.
        let root = check(&mut encoder, request("chatgpt.com", "/"));
        assert_eq!(
            &root[..5],
            &[0x80 | 3, 0x80 | 7, 0x80 | 63, 0x80 | 4, 0x80 | 62]
        );
        // Another authority is inserted; the first one keeps its (moved) entry.
        let b = check(&mut encoder, request("example.com", path));
        assert_eq!(b[2], 0b0100_0000 | 1);
        let a = check(&mut encoder, request("chatgpt.com", path));
        assert_eq!(a[2], 0x80 | 64);
        // Evicted (table size 0, then back): inserted again, never a stale index.
        encoder.update_max_size(0);
        let none = check(&mut encoder, request("chatgpt.com", path));
        assert_eq!(&none[..4], &[0x20, 0x80 | 3, 0x80 | 7, 0x01]);
        encoder.update_max_size(4096);
        let back = check(&mut encoder, request("chatgpt.com", path));
        assert_eq!(&back[..4], &[0x3f, 0xe1, 0x1f, 0x80 | 3]);
        assert_eq!(back[5], 0b0100_0000 | 1, "inserted again");
        assert_eq!(check(&mut encoder, request("chatgpt.com", path)), again);
    }

    /// codex-gateway patch (change 16): `encode_fields` writes what `encode` writes for the
    /// same fields (a repeated name nameless), request after request on one connection:
    /// memo hits, insertions, evictions, sensitive values, table size updates.
    #[test]
    fn fields_read_in_place_encode_as_owned_headers_do() {
        let mut by_header = Encoder::default();
        let mut in_place = Encoder::default();
        let mut seed = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let names = [
            "user-agent",
            "originator",
            "chatgpt-account-id",
            "set-cookie",
            "content-length",
            "authorization",
            "x-session",
            "accept",
        ];
        for round in 0..400 {
            if round % 97 == 96 {
                let size = [0, 256, 4096][(next() % 3) as usize];
                by_header.update_max_size(size);
                in_place.update_max_size(size);
            }
            let mut fields: Vec<(HeaderName, HeaderValue)> = Vec::new();
            for _ in 0..(next() % 10) {
                let name = HeaderName::from_static(names[(next() % names.len() as u64) as usize]);
                let value = match next() % 4 {
                    0 => format!("v{}", next() % 3),
                    1 => format!("v{}", next() % 1000),
                    2 => "x".repeat((next() % 300) as usize),
                    _ => "constant".to_string(),
                };
                let mut value = HeaderValue::from_str(&value).unwrap();
                if name == http::header::AUTHORIZATION || next() % 13 == 0 {
                    value.set_sensitive(true);
                }
                fields.push((name, value));
                // Now and then the same name again, at once.
                if next() % 4 == 0 {
                    let (n, v) = fields.last().unwrap().clone();
                    fields.push((n, v));
                }
            }
            let pseudo = || vec![method("POST"), Header::Path(BytesStr::from("/p"))];
            let owned: Vec<Header<Option<HeaderName>>> = pseudo()
                .into_iter()
                .chain(fields.iter().enumerate().map(|(i, (n, v))| Header::Field {
                    name: (i == 0 || fields[i - 1].0 != *n).then(|| n.clone()),
                    value: v.clone(),
                }))
                .collect();
            let mut a = BytesMut::new();
            by_header.encode(owned, &mut a);
            let mut b = BytesMut::new();
            in_place.encode_fields(pseudo(), &fields, &mut b);
            assert_eq!(a, b, "round {round}");
        }
    }

    #[test]
    fn a_sensitive_value_is_never_remembered_nor_indexed() {
        let mut encoder = Encoder::default();
        for _ in 0..3 {
            let mut value = HeaderValue::from_static("secret");
            value.set_sensitive(true);
            let res = encode(
                &mut encoder,
                vec![Header::Field {
                    name: Some(HeaderName::from_static("x-token")),
                    value,
                }],
            );
            // Never indexed (0001xxxx), literal name.
            assert_eq!(res[0], 0b0001_0000);
            assert_eq!(encoder.table.len(), 0);
            assert!(encoder.memo.is_empty());
        }
    }

    fn encode(e: &mut Encoder, hdrs: Vec<Header<Option<HeaderName>>>) -> BytesMut {
        let mut dst = BytesMut::with_capacity(1024);
        e.encode(&mut hdrs.into_iter(), &mut dst);
        dst
    }

    fn method(s: &str) -> Header<Option<HeaderName>> {
        Header::Method(Method::from_bytes(s.as_bytes()).unwrap())
    }

    fn header(name: &str, val: &str) -> Header<Option<HeaderName>> {
        let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
        let value = HeaderValue::from_bytes(val.as_bytes()).unwrap();

        Header::Field {
            name: Some(name),
            value,
        }
    }

    fn huff_decode(src: &[u8]) -> BytesMut {
        let mut buf = BytesMut::new();
        huffman::decode(src, &mut buf).unwrap()
    }
}
