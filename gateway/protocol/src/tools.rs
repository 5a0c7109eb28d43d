//! Tool names both client dialects send upstream: the Codex 64-character limit, the
//! shortening that meets it, and the reverse map the response side restores names with.
//!
//! # Key Components
//! - [`MAX_TOOL_NAME_LEN`]: the longest tool name the Codex backend accepts.
//! - [`ToolNameMap`]: `short -> original` pairs for one request; [`ToolNameMap::restore`] is
//!   what the response side calls on every tool name it emits.
//!
//! A name of at most [`MAX_TOOL_NAME_LEN`] bytes is kept as is and never enters the map. A
//! longer one becomes its first 55 bytes (cut on a char boundary) + `_` + 8 hex digits of an
//! FNV-1a hash of the full name; on a clash with another name of the same request the hash is
//! salted until the result is unique. The same original always maps to the same short name
//! within a request (tools, `tool_choice` and assistant history agree).

/// The longest tool name the Codex backend accepts.
pub const MAX_TOOL_NAME_LEN: usize = 64;

/// Bytes of the original name kept in a shortened one.
const KEEP: usize = 55;

/// Reverse map of the tool names shortened in one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolNameMap {
    /// `(short, original)` pairs; tiny, so a linear scan beats hashing.
    entries: Vec<(String, String)>,
}

// === impl ToolNameMap ===

impl ToolNameMap {
    /// An empty map (nothing was shortened).
    pub fn new() -> Self {
        Self::default()
    }

    /// True when no name was shortened.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number of shortened names.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The `(short, original)` pairs.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(s, o)| (s.as_str(), o.as_str()))
    }

    /// The client's original name for an upstream (possibly shortened) name.
    pub fn restore<'a>(&'a self, name: &'a str) -> &'a str {
        self.entries
            .iter()
            .find(|(s, _)| s == name)
            .map_or(name, |(_, o)| o.as_str())
    }

    /// The short name given to `original`, if it was shortened.
    pub fn shortened(&self, original: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(_, o)| o == original)
            .map(|(s, _)| s.as_str())
    }

    /// The upstream name for `original`: itself when short enough, else a stable shortened
    /// name recorded in the map. `reserved` lists the request's names that are already short
    /// (a shortened name must not collide with them).
    pub(crate) fn upstream_name<'a>(&'a mut self, original: &'a str, reserved: &[&str]) -> &'a str {
        if original.len() <= MAX_TOOL_NAME_LEN {
            return original;
        }
        let pos = match self.entries.iter().position(|(_, o)| o == original) {
            Some(p) => p,
            None => {
                let short = self.fresh_short(original, reserved);
                self.entries.push((short, original.to_owned()));
                self.entries.len() - 1
            }
        };
        self.entries.get(pos).map_or(original, |(s, _)| s.as_str())
    }

    fn fresh_short(&self, original: &str, reserved: &[&str]) -> String {
        let mut cut = KEEP.min(original.len());
        while !original.is_char_boundary(cut) {
            cut -= 1;
        }
        let prefix = &original[..cut];
        let mut salt = 0u64;
        loop {
            let mut short = String::with_capacity(cut + 9);
            short.push_str(prefix);
            short.push('_');
            let h = fnv1a(original.as_bytes(), salt);
            for shift in (0..8).rev() {
                let nibble = ((h >> (shift * 4)) & 0xf) as u8;
                short.push(char::from(b"0123456789abcdef"[nibble as usize]));
            }
            let taken =
                reserved.contains(&short.as_str()) || self.entries.iter().any(|(s, _)| *s == short);
            if !taken {
                return short;
            }
            salt += 1;
        }
    }
}

/// 64-bit FNV-1a, folded to 32 bits, with a salt mixed in first.
fn fnv1a(bytes: &[u8], salt: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    if salt != 0 {
        for b in salt.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h ^ (h >> 32)) & 0xffff_ffff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_pass_through() {
        let mut m = ToolNameMap::new();
        assert_eq!(m.upstream_name("get_weather", &[]), "get_weather");
        assert!(m.is_empty());
        assert_eq!(m.restore("get_weather"), "get_weather");
    }

    #[test]
    fn long_names_are_stable_unique_and_restorable() {
        let a = format!("{}_alpha", "x".repeat(70));
        let b = format!("{}_beta", "x".repeat(70));
        let mut m = ToolNameMap::new();
        let sa = m.upstream_name(&a, &[]).to_owned();
        let sb = m.upstream_name(&b, &[]).to_owned();
        assert_eq!(sa.len(), 64);
        assert_ne!(sa, sb);
        assert_eq!(m.upstream_name(&a, &[]), sa);
        assert_eq!(m.len(), 2);
        assert_eq!(m.restore(&sa), a);
        assert_eq!(m.restore(&sb), b);
        assert_eq!(m.shortened(&a), Some(sa.as_str()));
        // deterministic across requests
        let mut m2 = ToolNameMap::new();
        assert_eq!(m2.upstream_name(&a, &[]), sa);
        // a reserved clash is salted away
        let mut m3 = ToolNameMap::new();
        let s3 = m3.upstream_name(&a, &[sa.as_str()]).to_owned();
        assert_ne!(s3, sa);
        assert_eq!(m3.restore(&s3), a);
    }

    #[test]
    fn multibyte_cut_is_on_char_boundary() {
        let name = "é".repeat(40);
        let mut m = ToolNameMap::new();
        let s = m.upstream_name(&name, &[]).to_owned();
        assert!(s.len() <= 64);
        assert_eq!(m.restore(&s), name);
    }
}
