//! A header block's regular fields as a list (codex-gateway patch, `vendor/README.md`).
//!
//! The published crate carried every header block in an `http::HeaderMap`: each decoded
//! field hashed and inserted (the map grown from empty), and each request header inserted
//! into a map only to be iterated out again by the HPACK encoder. A block holds a dozen or
//! two fields, read a few times at most, so a list in wire order does the same job with one
//! allocation and no hashing. `HeaderMap`s stay at the public edges that take or give one
//! (the server, trailers, push promises, `SendRequest::send_request`); a client that wants
//! no map sends with `SendRequest::send_request_fields` and gets [`ResponseHead`]s.

use http::{
    header::{HeaderName, HeaderValue},
    HeaderMap, StatusCode,
};

/// Header fields in wire order (names lower-case; a repeated name is repeated).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fields(Vec<(HeaderName, HeaderValue)>);

impl Fields {
    /// An empty list.
    pub const fn new() -> Self {
        Fields(Vec::new())
    }

    /// An empty list with room for `n` fields.
    pub fn with_capacity(n: usize) -> Self {
        Fields(Vec::with_capacity(n))
    }

    /// Appends a field.
    pub fn push(&mut self, name: HeaderName, value: HeaderValue) {
        self.0.push((name, value));
    }

    /// The number of fields.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first value of the field `name` (lower-case).
    pub fn get(&self, name: &str) -> Option<&HeaderValue> {
        self.0
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, v)| v)
    }

    /// Every value of the field `name` (lower-case), in order.
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a HeaderValue> + 'a {
        self.0
            .iter()
            .filter(move |(n, _)| n.as_str() == name)
            .map(|(_, v)| v)
    }

    /// Every field, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, (HeaderName, HeaderValue)> {
        self.0.iter()
    }

    /// The fields as an `http::HeaderMap` (for the APIs that give one).
    pub fn into_header_map(self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.0.len());
        for (n, v) in self.0 {
            map.append(n, v);
        }
        map
    }

    /// The fields of an `http::HeaderMap`, in its iteration order.
    pub fn from_header_map(map: HeaderMap) -> Self {
        let mut out = Vec::with_capacity(map.len());
        let mut last: Option<HeaderName> = None;
        for (n, v) in map {
            if let Some(n) = n {
                last = Some(n);
            }
            // `HeaderMap::into_iter` names the first value of each name.
            if let Some(n) = &last {
                out.push((n.clone(), v));
            }
        }
        Fields(out)
    }
}

impl IntoIterator for Fields {
    type Item = (HeaderName, HeaderValue);
    type IntoIter = std::vec::IntoIter<(HeaderName, HeaderValue)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl From<Vec<(HeaderName, HeaderValue)>> for Fields {
    fn from(v: Vec<(HeaderName, HeaderValue)>) -> Self {
        Fields(v)
    }
}

/// A response head as the client received it: no `HeaderMap` built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// `:status`.
    pub status: StatusCode,
    /// The regular fields in wire order.
    pub fields: Fields,
}
