//! Process wiring: [`App::spawn`] starts the sidecar thread (`admin`) and the pinned workers
//! (`gateway`) and returns a handle with the bound addresses. The binary and the in-process
//! integration tests use the same entry point (docs/conventions.md#composition-root). This is the one place that
//! knows both sides: the workers get what the sidecar publishes (the snapshot and catalog
//! cells, the fact and command channels of `shared-state`), never the sidecar itself.
//!
//! # Key Components
//! - [`App::spawn`]: binds N `SO_REUSEPORT` listeners (port 0 resolves once), starts the
//!   sidecar (storage, first snapshot, admin API) and waits for every worker to be ready.
//! - [`AppHandle::shutdown`]: drain: stop accepting, let open streams finish within the grace
//!   period, flush facts, stop the sidecar.

use std::{net::SocketAddr, sync::Arc, thread::JoinHandle, time::Duration};

use admin::SidecarShared;
use shared_state::{
    channels::{events, mailboxes},
    snapshot::Health,
    SharedSnapshot, Snapshot, WorkerCommand, WorkerMailboxes,
};

use gateway::{
    config::UpstreamConfig,
    metrics::Registry,
    upstream::tls::install_crypto_provider,
    worker::{self, WorkerSeed},
};

/// Start-up failure.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Could not bind the data-plane address.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The sidecar failed (storage, Redis, admin bind).
    #[error("{0}")]
    Sidecar(String),
    /// A worker failed to start.
    #[error("worker failed to start: {0}")]
    Worker(String),
}

/// The running gateway.
pub struct App;

/// Handle to a running gateway.
pub struct AppHandle {
    /// Bound data-plane address.
    pub data_addr: SocketAddr,
    /// Bound admin address.
    pub admin_addr: SocketAddr,
    /// Driver per worker.
    pub drivers: Vec<&'static str>,
    /// Metrics registry.
    pub registry: Registry,
    /// Snapshot cell (tests inspect live account state through it).
    pub snapshot: SharedSnapshot,
    /// Model catalog cell.
    pub catalog: shared_state::SharedCatalog,
    /// What `/healthz` reports (tests reach the sidecar's supervised tasks through it).
    pub health: Arc<Health>,
    mailboxes: WorkerMailboxes,
    workers: Vec<JoinHandle<()>>,
    sidecar: Option<admin::SidecarHandle>,
}

fn bind_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(4096)?;
    Ok(s.into())
}

/// Resolves the upstream host now and then every 30 s (5 s while unresolved) on a small
/// named thread, so workers never block on getaddrinfo. A failure keeps the last good answer.
fn spawn_resolver(up: &UpstreamConfig) {
    let up = up.clone();
    if up.host.parse::<std::net::IpAddr>().is_ok() {
        return;
    }
    match up.resolve_now() {
        Ok(n) => tracing::info!(host = %up.host, addrs = n, "upstream resolved"),
        Err(e) => {
            tracing::warn!(host = %up.host, error = %e, "cannot resolve the upstream yet; retrying")
        }
    }
    let _ = std::thread::Builder::new()
        .name("codex-resolver".into())
        .spawn(move || loop {
            let every = if up.addrs.get().is_empty() { 5 } else { 30 };
            std::thread::sleep(Duration::from_secs(every));
            if let Err(e) = up.resolve_now() {
                tracing::warn!(host = %up.host, error = %e, "upstream DNS refresh failed");
            }
        });
}

/// Raises the open-file soft limit to the hard limit (many concurrent streams) and returns
/// the limit now in force (`None` when it cannot be read).
fn raise_nofile() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => {
            tracing::debug!(limit = n, "open-file limit");
            Some(n)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
            rlimit::getrlimit(rlimit::Resource::NOFILE)
                .ok()
                .map(|(soft, _)| soft)
        }
    }
}

/// The open-connection cap when the configuration leaves it automatic (`max_connections =
/// 0`): below the descriptor limit, so a flood of idle connections cannot take the
/// descriptors that upstream connections, the database, Redis, the admin listener and the
/// logs need. A reserve (a quarter of the limit, at most 1,024) is kept back, and what is left
/// is halved, since a client connection can hold an upstream connection of its own (an
/// HTTP/1.1 upstream, a WebSocket session's upstream socket).
pub fn auto_max_connections(nofile: u64) -> usize {
    let nofile = usize::try_from(nofile).unwrap_or(usize::MAX);
    let reserve = (nofile / 4).min(1024);
    (nofile.saturating_sub(reserve) / 2).max(1)
}

// === impl App ===

impl App {
    /// Starts the sidecar and the workers.
    pub fn spawn(config: crate::config::Config) -> Result<AppHandle, StartError> {
        install_crypto_provider();
        let nofile = raise_nofile();
        // Each component gets its own slice.
        let cfg = Arc::new(config.gateway_slice());
        let mut sc = config.sidecar_slice();
        let n = cfg.workers.max(1);
        spawn_resolver(&cfg.upstream);

        // Listeners first: a port in use is reported before anything starts.
        let first = bind_listener(config.listen).map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
        let data_addr = first.local_addr().map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
        let mut listeners = vec![first];
        for _ in 1..n {
            listeners.push(bind_listener(data_addr).map_err(|source| StartError::Bind {
                addr: data_addr,
                source,
            })?);
        }

        let snapshot = Snapshot::shared();
        // The embedded catalog until the sidecar fetches the upstream's.
        let catalog = shared_state::ModelCatalog::embedded(sc.model_aliases.clone()).shared();
        let health = Arc::new(Health::with_workers(n));
        let transcripts = Arc::new(shared_state::TranscriptStore::new(
            config.transcript_cache_bytes,
            cfg.transcript_ttl,
        ));
        let (ev_tx, ev_rx) = events();
        let (mb, boxes) = mailboxes(n);
        // The dashboard and ops page read the workers' metrics from the data listener.
        sc.metrics_url = Some(format!(
            "http://{}/metrics",
            SocketAddr::new(
                if data_addr.ip().is_unspecified() {
                    std::net::Ipv4Addr::LOCALHOST.into()
                } else {
                    data_addr.ip()
                },
                data_addr.port()
            )
        ));
        // The ops page's scheduler board comes from the scheduler itself.
        sc.scheduler_board = Some(gateway::scheduler::board);
        // Workers share transcripts through Redis too (resolved here: workers never call
        // getaddrinfo). Not fatal: without it a chain continues on its own instance only.
        let redis = sc.redis_url.as_deref().and_then(|url| {
            gateway::redis::RedisTarget::resolve(url)
                .map_err(|e| {
                    tracing::warn!(error = %e, "workers run without Redis: previous_response_id continues on this instance only")
                })
                .ok()
        });
        let sidecar = admin::spawn(
            sc,
            SidecarShared {
                snapshot: Arc::clone(&snapshot),
                health: Arc::clone(&health),
                events: ev_rx,
                mailboxes: mb.clone(),
                catalog: Arc::clone(&catalog),
            },
        )
        .map_err(|e| StartError::Sidecar(e.to_string()))?;
        let admin_addr = sidecar.admin_addr;

        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let registry = Registry::new(n);
        let conns = Arc::new(gateway::server::admission::ConnGate::new(
            match (config.max_connections, nofile) {
                (0, Some(n)) => auto_max_connections(n),
                (n, _) => n,
            },
            config.max_connections_per_ip,
        ));
        // Who minted which account-bound blob: this app's workers share it (and, through
        // Redis when configured, other instances).
        let owners = Arc::new(gateway::owners::BlobOwners::with_defaults());
        // Request rates and the allow-list: one set of cells for this instance's workers.
        let front_door = Arc::new(gateway::front_door::FrontDoor::new());
        let mut workers = Vec::with_capacity(n);
        for (id, (listener, mailbox)) in listeners.into_iter().zip(boxes).enumerate() {
            let seed = WorkerSeed {
                id,
                cpu: (config.pin_workers && n <= cores).then_some(id % cores),
                listener,
                cfg: Arc::clone(&cfg),
                snapshot: Arc::clone(&snapshot),
                health: Arc::clone(&health),
                events: ev_tx.clone(),
                mailbox,
                registry: registry.clone(),
                catalog: Arc::clone(&catalog),
                transcripts: Arc::clone(&transcripts),
                redis: redis.clone(),
                owners: Arc::clone(&owners),
                conns: Arc::clone(&conns),
                front_door: Arc::clone(&front_door),
            };
            let ready = ready_tx.clone();
            let h = std::thread::Builder::new()
                .name(format!("gateway-worker-{id}"))
                .spawn(move || worker::run(seed, ready))
                .map_err(|e| StartError::Worker(e.to_string()))?;
            workers.push(h);
        }
        let mut drivers = Vec::with_capacity(n);
        let mut handle = AppHandle {
            data_addr,
            admin_addr,
            drivers: Vec::new(),
            registry,
            snapshot,
            catalog,
            health,
            mailboxes: mb,
            workers,
            sidecar: Some(sidecar),
        };
        for _ in 0..n {
            match ready_rx.recv_timeout(Duration::from_secs(30)) {
                Ok(Ok(d)) => drivers.push(d),
                Ok(Err(e)) => {
                    handle.shutdown();
                    return Err(StartError::Worker(e));
                }
                Err(_) => {
                    handle.shutdown();
                    return Err(StartError::Worker("worker did not start in time".into()));
                }
            }
        }
        handle.drivers = drivers;
        tracing::info!(addr = %data_addr, admin = %admin_addr, workers = n, "codex-gateway listening");
        Ok(handle)
    }
}

// === impl AppHandle ===

impl AppHandle {
    /// Drains and stops everything; returns when workers and the sidecar are done.
    pub fn shutdown(&mut self) {
        self.mailboxes.broadcast(&WorkerCommand::Drain);
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        if let Some(s) = self.sidecar.take() {
            s.shutdown();
        }
    }
}

impl Drop for AppHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::auto_max_connections;

    #[test]
    fn the_automatic_connection_cap_keeps_a_reserve_below_the_descriptor_limit() {
        assert_eq!(auto_max_connections(20_000), (20_000 - 1024) / 2);
        assert_eq!(auto_max_connections(1024), (1024 - 256) / 2);
        assert_eq!(auto_max_connections(1_048_576), (1_048_576 - 1024) / 2);
        assert_eq!(auto_max_connections(1), 1);
        assert!(auto_max_connections(u64::MAX) > 1 << 40);
    }
}
