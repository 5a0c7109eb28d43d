//! Connection admission: a cap on open client connections for the whole process and one per
//! client IP, shared by every worker (a connection lands on any worker's `SO_REUSEPORT`
//! listener, so per-worker counts would not bound a client).
//!
//! # Key Components
//! - [`ConnGate`]: the counters; [`ConnGate::admit`] takes a place or says why not.
//! - [`Admitted`]: the place, given back when dropped (however the connection ends).
//! - [`Refusal`]: why a connection was refused; its answer (503 at the global cap, 429 at the
//!   per-IP cap, both with `retry-after`, in OpenAI's shape: no request says otherwise) is the
//!   error mapping's (`crate::error::ErrorKind::ConnectionCap`).
//!
//! # Error handling
//! Nothing fails here; a refusal is a value. The accept loop answers and closes.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
};

/// Shards of the per-IP map (one short critical section per accept and per close).
const SHARDS: usize = 16;

/// Open-connection counters shared by the workers.
#[derive(Debug)]
pub struct ConnGate {
    max_total: usize,
    max_per_ip: usize,
    open: AtomicUsize,
    per_ip: Vec<Mutex<HashMap<IpAddr, usize>>>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The process is at `max_connections`.
    Global,
    /// This client IP is at `max_connections_per_ip`.
    PerIp,
}

/// A place taken by an open connection; released on drop.
#[derive(Debug)]
pub struct Admitted {
    gate: Arc<ConnGate>,
    ip: Option<IpAddr>,
}

// === impl ConnGate ===

impl ConnGate {
    /// A gate with these caps (0: no cap).
    pub fn new(max_total: usize, max_per_ip: usize) -> Self {
        Self {
            max_total,
            max_per_ip,
            open: AtomicUsize::new(0),
            per_ip: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    /// The cap on open connections (0: none).
    pub fn max_total(&self) -> usize {
        self.max_total
    }

    /// Open connections admitted and not yet closed.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    fn shard(&self, ip: &IpAddr) -> &Mutex<HashMap<IpAddr, usize>> {
        let h = match ip {
            IpAddr::V4(v4) => u32::from(*v4) as usize,
            IpAddr::V6(v6) => {
                let o = v6.octets();
                usize::from(o[15]) ^ (usize::from(o[7]) << 8)
            }
        };
        &self.per_ip[h.wrapping_mul(0x9E37_79B9) % SHARDS]
    }

    /// Takes a place for a connection from `ip`, or says which cap it hit.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Admitted, Refusal> {
        let prev = self.open.fetch_add(1, Ordering::AcqRel);
        if self.max_total > 0 && prev >= self.max_total {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::Global);
        }
        let mut tracked = None;
        if self.max_per_ip > 0 {
            let ip = ip.to_canonical();
            let mut map = self
                .shard(&ip)
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let n = map.entry(ip).or_insert(0);
            if *n >= self.max_per_ip {
                drop(map);
                self.open.fetch_sub(1, Ordering::AcqRel);
                return Err(Refusal::PerIp);
            }
            *n += 1;
            tracked = Some(ip);
        }
        Ok(Admitted {
            gate: Arc::clone(self),
            ip: tracked,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some(ip) = self.ip {
            let mut map = self
                .gate
                .shard(&ip)
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(n) = map.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&ip);
                }
            }
        }
        self.gate.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_are_taken_and_given_back() {
        let gate = Arc::new(ConnGate::new(3, 2));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let a1 = gate.admit(a).unwrap();
        let _a2 = gate.admit(mapped).unwrap();
        assert_eq!(
            gate.admit(a).unwrap_err(),
            Refusal::PerIp,
            "v4-mapped is the same IP"
        );
        let _b1 = gate.admit(b).unwrap();
        assert_eq!(gate.admit(b).unwrap_err(), Refusal::Global);
        assert_eq!(gate.open(), 3);
        drop(a1);
        assert_eq!(gate.open(), 2);
        let _a3 = gate.admit(a).unwrap();
        let open = Arc::new(ConnGate::new(0, 0));
        let held: Vec<_> = (0..1000).map(|_| open.admit(a).unwrap()).collect();
        assert_eq!(open.open(), 1000);
        drop(held);
        assert_eq!(open.open(), 0);
        assert!(open.per_ip.iter().all(|s| s.lock().unwrap().is_empty()));
    }
}
