//! The data plane's IP allow-list (`ip_allow_list` setting): IPv4 and IPv6 addresses and CIDR
//! blocks, parsed once when the setting is applied and checked by the workers per connection
//! and per request (`gateway::front_door`).
//!
//! # Key Components
//! - [`IpAllowList`]: the parsed list; [`IpAllowList::allows`] (an empty list allows
//!   everyone). IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`) are the IPv4 address they
//!   carry, in the list and in a peer address alike.
//! - [`IpNet`]: one block (a bare address is a /32 or /128).
//!
//! # Usage
//! ```
//! let l: shared_state::ip_list::IpAllowList = "10.0.0.0/8, 2001:db8::/32 192.168.1.7".parse().unwrap();
//! assert!(l.allows("10.1.2.3".parse().unwrap()));
//! assert!(l.allows("::ffff:10.1.2.3".parse().unwrap()));
//! assert!(!l.allows("192.168.1.8".parse().unwrap()));
//! assert!("10.0.0.0/33".parse::<shared_state::ip_list::IpAllowList>().is_err());
//! ```
//!
//! # Error handling
//! Parsing refuses the whole list at the first invalid entry, naming it ([`InvalidEntry`]).

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

/// One address block: a network address (host bits cleared) and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

/// An entry of an allow-list that is neither an IP address nor a CIDR block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an IP address or CIDR block (e.g. 203.0.113.7, 10.0.0.0/8, 2001:db8::/32)")]
pub struct InvalidEntry(pub String);

// === impl IpNet ===

impl IpNet {
    /// The block of `addr` with `prefix` bits (host bits cleared); `None` past the family's
    /// width. An IPv4-mapped IPv6 block (`::ffff:a.b.c.d/n`, n >= 96) is the IPv4 block.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        let (addr, prefix) = match addr {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) if prefix >= 96 => (IpAddr::V4(v4), prefix - 96),
                _ => (IpAddr::V6(v6), prefix),
            },
            v4 => (v4, prefix),
        };
        let addr = match addr {
            IpAddr::V4(a) if prefix <= 32 => {
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask4(prefix)))
            }
            IpAddr::V6(a) if prefix <= 128 => {
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask6(prefix)))
            }
            _ => return None,
        };
        Some(Self { addr, prefix })
    }

    /// Whether `ip` is in the block (an IPv4-mapped IPv6 `ip` as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(a)) => u32::from(a) & mask4(self.prefix) == u32::from(net),
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                u128::from(a) & mask6(self.prefix) == u128::from(net)
            }
            _ => false,
        }
    }
}

fn mask4(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask6(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

impl FromStr for IpNet {
    type Err = InvalidEntry;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || InvalidEntry(s.to_owned());
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => {
                // Digits only: `u8::from_str` would take a `+`.
                if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                (a, Some(p.parse::<u8>().map_err(|_| bad())?))
            }
            None => (s, None),
        };
        let addr: IpAddr = addr
            .strip_prefix('[')
            .and_then(|a| a.strip_suffix(']'))
            .unwrap_or(addr)
            .parse()
            .map_err(|_| bad())?;
        let full = if addr.is_ipv4() { 32 } else { 128 };
        Self::new(addr, prefix.unwrap_or(full)).ok_or_else(bad)
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix == full {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

/// The parsed `ip_allow_list`: empty allows everyone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpAllowList(Vec<IpNet>);

// === impl IpAllowList ===

impl IpAllowList {
    /// Whether the list is empty (everyone allowed).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The blocks, in the order given (duplicates removed).
    pub fn nets(&self) -> &[IpNet] {
        &self.0
    }

    /// Whether a client at `ip` may use the data plane: the list is empty or a block holds
    /// it. A scan of the blocks, no allocation (lists are short; each test is a mask).
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.0.is_empty() || self.0.iter().any(|n| n.contains(ip))
    }
}

impl FromStr for IpAllowList {
    type Err = InvalidEntry;

    /// Entries separated by commas and/or white space; an empty text is the empty list.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut nets: Vec<IpNet> = Vec::new();
        for entry in s
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|e| !e.is_empty())
        {
            let n: IpNet = entry.parse()?;
            if !nets.contains(&n) {
                nets.push(n);
            }
        }
        Ok(Self(nets))
    }
}

impl fmt::Display for IpAllowList {
    /// The canonical text form: blocks separated by `", "` (parses back to the same list).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv4_blocks_and_addresses() {
        let l: IpAllowList = "10.0.0.0/8,192.168.1.7  172.16.5.9/12".parse().unwrap();
        assert!(l.allows(ip("10.255.0.1")));
        assert!(l.allows(ip("192.168.1.7")));
        assert!(!l.allows(ip("192.168.1.8")));
        // Host bits are cleared: 172.16.5.9/12 is 172.16.0.0/12.
        assert!(l.allows(ip("172.31.255.255")));
        assert!(!l.allows(ip("172.32.0.0")));
        assert!(!l.allows(ip("11.0.0.1")));
        assert_eq!(l.to_string(), "10.0.0.0/8, 192.168.1.7, 172.16.0.0/12");
        let all: IpAllowList = "0.0.0.0/0".parse().unwrap();
        assert!(all.allows(ip("1.2.3.4")));
        assert!(
            !all.allows(ip("::1")),
            "an IPv4 block holds no IPv6 address"
        );
    }

    #[test]
    fn ipv6_blocks_and_addresses() {
        let l: IpAllowList = "2001:db8::/32 ::1 [fe80::1]".parse().unwrap();
        assert!(l.allows(ip("2001:db8:ffff::1")));
        assert!(!l.allows(ip("2001:db9::1")));
        assert!(l.allows(ip("::1")));
        assert!(l.allows(ip("fe80::1")));
        assert!(!l.allows(ip("127.0.0.1")));
        assert_eq!(l.to_string(), "2001:db8::/32, ::1, fe80::1");
        let all: IpAllowList = "::/0".parse().unwrap();
        assert!(all.allows(ip("2001:db8::1")));
    }

    #[test]
    fn ipv4_mapped_ipv6_is_the_ipv4_address() {
        // A mapped peer against an IPv4 list (a dual-stack listener reports v4 peers so).
        let l: IpAllowList = "127.0.0.0/8".parse().unwrap();
        assert!(l.allows(ip("::ffff:127.0.0.2")));
        assert!(!l.allows(ip("::ffff:128.0.0.1")));
        // A mapped entry is the IPv4 block it maps.
        let l: IpAllowList = "::ffff:10.0.0.0/104, ::ffff:192.0.2.1".parse().unwrap();
        assert_eq!(l.to_string(), "10.0.0.0/8, 192.0.2.1");
        assert!(l.allows(ip("10.9.9.9")));
        assert!(l.allows(ip("::ffff:192.0.2.1")));
        assert!(!l.allows(ip("192.0.2.2")));
    }

    #[test]
    fn empty_allows_everyone_and_bad_entries_are_named() {
        let l: IpAllowList = " , ".parse().unwrap();
        assert!(l.is_empty() && l.allows(ip("8.8.8.8")) && l.allows(ip("::1")));
        assert_eq!("".parse::<IpAllowList>().unwrap(), IpAllowList::default());
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.300",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "10.0.0.0/8/8",
            "example.com",
            "10.0.0.1:80",
            "2001:db8::/-1",
        ] {
            let e = format!("10.0.0.1, {bad}")
                .parse::<IpAllowList>()
                .unwrap_err();
            assert_eq!(e.0, bad, "{bad}");
            assert!(e.to_string().contains(bad));
        }
        // Duplicates (after normalisation) are kept once.
        let l: IpAllowList = "10.0.0.1/8 10.0.0.0/8 ::ffff:10.0.0.0/104".parse().unwrap();
        assert_eq!(l.nets().len(), 1);
    }
}
