//! The sidecar thread's body: startup, the background tasks, and shutdown.
//!
//! # Key Components
//! - `Services`: the services of [`crate::services`] (storage and publisher, refresh, quota,
//!   catalog, accounts, ops, forecast, proxies, pool, session), built here; each task and
//!   each admin router receives only its own ([`crate::api::ApiServices`]).
//! - [`run`]: opens storage, connects Redis, publishes the first snapshot, binds the admin
//!   listener, reports readiness, then runs until told to stop:
//!   - the event loops ([`events`]): usage through the durable spool ([`crate::spool`]) into
//!     the database with hourly rollups and retention; account effects, quota and refresh
//!     requests on their own queue;
//!   - the reload loop: `Publisher::reload_quiet(false)` every `reload_interval`, plus refresh ahead
//!     of access-token expiry;
//!   - the quota poller ([`quota`]): each active account's `/wham/usage` once per
//!     `quota_poll_interval`, staggered (off when the interval is zero);
//!   - the model catalog refresher ([`models`]): the upstream `/models` per plan, merged into
//!     the shared catalog shortly after start and every `catalog_refresh_interval` (off when
//!     zero);
//!   - the health probe: `ping` every 2 s into [`Health::set_storage_up`];
//!   - the quota forecast sampler ([`crate::forecast`]): every minute, publishing burn rates;
//!   - the per-key counter reconciliation ([`key_limits`]): every 500 ms with Redis, and
//!     `last_used_at` of the keys;
//!   - fleet invalidations over Redis pub/sub ([`crate::pubsub`]), with Redis only;
//!   - auto-clean ([`crate::clean`]): dead accounts disabled or deleted after the configured
//!     time (off by default);
//!   - the watched auth directory ([`crate::auth_dir`]), when `auth_dir` is configured;
//!   - the Axum admin server ([`crate::api`]).
//!
//!   Each runs under the [`crate::supervisor`]: a panic or an unexpected return is counted
//!   and restarted with backoff (`spawn_tasks` names them).
//!
//! # Error handling
//! Startup errors go back to [`crate::spawn`]'s caller. After startup nothing is fatal:
//! storage outages are logged on transition, spooled and retried.

use std::{
    net::SocketAddr,
    sync::{mpsc::SyncSender, Arc},
    time::Duration,
};

use shared_state::Health;
use tokio::{sync::watch, task::JoinHandle};

use crate::{
    api::ApiServices,
    error::SidecarError,
    lease::RedisLeases,
    models::ModelsClient,
    oauth::{build_http_client, OAuthClient},
    publish::Publisher,
    quota::UsageClient,
    services::{
        admin::{OpsSampler, PendingLogins},
        events::{self, Settle},
        key_limits, models, quota, refresh, Accounts, Catalog, Egress, Forecast, Leases, Ops, Pool,
        Proxies, Quota, Refresher, ResetCredits, Session, Store, FLUSH_ON_SHUTDOWN,
    },
    storage::Storage,
    supervisor::Supervisor,
    SidecarConfig, SidecarShared,
};

/// Interval of the storage health probe.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(2);
/// How long shutdown waits for refreshes in flight.
pub const REFRESH_DRAIN: Duration = Duration::from_secs(3);

/// Runs the sidecar until `stop` flips to true. Reports startup success (the bound admin
/// address) or failure on `ready`.
pub(crate) async fn run(
    cfg: SidecarConfig,
    shared: SidecarShared,
    ready: SyncSender<Result<SocketAddr, SidecarError>>,
    stop: watch::Receiver<bool>,
) {
    let SidecarShared {
        snapshot,
        health,
        events,
        mailboxes,
        catalog,
    } = shared;
    let started = async {
        let storage = crate::storage::open(&cfg.db).await?;
        health.set_storage_up(true);
        let leases: Leases = Arc::default();
        let instance = crate::lease::new_instance_id();
        if let Some(url) = cfg.redis_url.as_deref().filter(|u| !u.trim().is_empty()) {
            match RedisLeases::connect(url, instance, cfg.refresh_lease_ttl).await {
                Ok(l) => {
                    health.set_redis_up(true);
                    let _ = leases.set(l);
                }
                Err(e) => {
                    // Not fatal: the data plane and refreshes work without Redis; the health
                    // loop keeps trying and says so in /healthz meanwhile.
                    tracing::error!(error = %e, "Redis is unreachable at start-up; starting without it and retrying");
                    health.set_redis_up(false);
                }
            }
        }
        let http =
            build_http_client(cfg.upstream_ca.as_deref()).map_err(SidecarError::HttpClient)?;
        let boot = crate::auth::bootstrap(
            storage.as_ref(),
            cfg.admin_password.as_ref(),
            cfg.admin_token.as_ref().is_some_and(|t| !t.is_empty()),
            cfg.admin_listen,
        )
        .await
        .map_err(SidecarError::AdminAuth)?;
        let publisher = Arc::new(Publisher::new(snapshot, mailboxes, cfg.settings.clone()));
        // Rotated tokens an earlier process could not store (storage was down) go first.
        let journal = crate::held::HeldJournal::open(&cfg.db.data_dir);
        let held = match &journal {
            Ok(j) => {
                crate::held::replay(j, storage.as_ref(), &|id, tokens| {
                    publisher.hold_tokens(id, tokens);
                })
                .await
            }
            Err(_) => Vec::new(),
        };
        publisher.reload(storage.as_ref(), true).await?;
        let listener = tokio::net::TcpListener::bind(cfg.admin_listen)
            .await
            .map_err(|source| SidecarError::Bind {
                addr: cfg.admin_listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| SidecarError::Bind {
            addr: cfg.admin_listen,
            source,
        })?;
        let services = Services::build(&cfg, storage, publisher, &health, leases, http, catalog);
        if let crate::auth::Bootstrap::Generated(pw) = &boot {
            crate::auth::announce_generated(pw, addr);
        }
        match journal {
            Ok(j) => services.store.publisher.set_journal(j),
            Err(e) => {
                tracing::error!(error = %e, "no held-token journal; tokens refreshed while storage is down are kept in memory only")
            }
        }
        for id in held {
            tokio::spawn(refresh::persist_held(Arc::clone(&services.refresh), id));
        }
        Ok::<_, SidecarError>((services, listener, addr))
    };
    let (services, listener, addr) = match started.await {
        Ok(v) => v,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    tracing::info!(
        admin = %addr,
        backend = ?services.store.storage.backend(),
        redis = services.leases.get().is_some(),
        version = services.store.publisher.current().version,
        "sidecar ready"
    );

    let tasks = spawn_tasks(&services, &cfg, events, listener, &health, &stop);

    health.sidecar_tasks().beat(shared_state::now_ms());
    if ready.send(Ok(addr)).is_err() {
        // The caller is gone; nothing will ever ask us to stop, so stop now.
        tracing::warn!("spawn() caller vanished during startup; stopping the sidecar");
    } else {
        let mut stop = stop;
        tokio::select! {
            _ = stop.wait_for(|s| *s) => {}
            () = beat(&health) => {}
        }
    }

    tracing::info!("sidecar stopping");
    tasks.stop().await;
    // A refresh between "endpoint rotated the token" and "stored it" must not be cut off.
    let _ = tokio::time::timeout(REFRESH_DRAIN, async {
        while !services.refresh.book.is_idle() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(2), services.store.storage.close()).await;
    tracing::info!("sidecar stopped");
}

/// The sidecar thread's heartbeat (`/healthz`'s `sidecar.thread`), on the thread's main
/// future: it stops when the runtime is blocked or the thread is gone. With the
/// `fault-injection` feature a test makes it panic here, outside every supervised task, which
/// ends the thread.
async fn beat(health: &Health) {
    let tasks = health.sidecar_tasks();
    let mut every =
        tokio::time::interval(Duration::from_millis(shared_state::tasks::SIDECAR_BEAT_MS));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        tasks.beat(shared_state::now_ms());
        if crate::TEST_HOOKS && tasks.take_injected_thread_panic() {
            #[allow(clippy::panic)]
            {
                panic!("injected fault in the sidecar thread");
            }
        }
    }
}

/// The sidecar's long-running tasks, each under the [`Supervisor`].
struct Tasks {
    server: JoinHandle<()>,
    usage: JoinHandle<()>,
    control: JoinHandle<()>,
    limits: JoinHandle<()>,
    /// Stopped by abort: nothing to flush.
    abortable: Vec<JoinHandle<()>>,
}

// === impl Tasks ===

impl Tasks {
    /// After `stop` was sent: aborts what has nothing to flush, then waits (bounded) for the
    /// rest to see the signal and finish.
    async fn stop(self) {
        for t in &self.abortable {
            t.abort();
        }
        // It sees the stop signal, pushes its last counts and stores the keys' last use.
        let _ = tokio::time::timeout(Duration::from_secs(3), self.limits).await;
        // The event loops see the same signal, drain and flush (bounded) before returning.
        let _ = tokio::time::timeout(FLUSH_ON_SHUTDOWN + Duration::from_secs(1), async {
            let _ = tokio::join!(self.usage, self.control);
        })
        .await;
        let _ = tokio::time::timeout(Duration::from_secs(3), self.server).await;
    }
}

/// The services the assembly builds ([`crate::services`]); each task and each admin router
/// receives only its own from here (`spawn_tasks`, [`crate::api::ApiServices`]).
struct Services {
    store: Store,
    health: Arc<Health>,
    leases: Leases,
    settle: Arc<Settle>,
    refresh: Arc<Refresher>,
    quota: Arc<Quota>,
    catalog: Arc<Catalog>,
    accounts: Arc<Accounts>,
    ops: Arc<Ops>,
    forecast: Arc<Forecast>,
    proxies: Arc<Proxies>,
    pool: Arc<Pool>,
    session: Arc<Session>,
    /// The direct token endpoint client (the auth directory's imports).
    oauth: OAuthClient,
}

// === impl Services ===

impl Services {
    fn build(
        cfg: &SidecarConfig,
        storage: Arc<dyn Storage>,
        publisher: Arc<Publisher>,
        health: &Arc<Health>,
        leases: Leases,
        http: reqwest::Client,
        catalog: shared_state::catalog::SharedCatalog,
    ) -> Self {
        let store = Store { storage, publisher };
        let usage = UsageClient::new(http.clone(), cfg.usage_endpoint());
        let oauth = OAuthClient::new(http, cfg.oauth_token_url.clone())
            .with_identity(&cfg.originator, &cfg.user_agent);
        let credits = Arc::new(ResetCredits::default());
        let settle = Arc::new(Settle::default());
        let egress = Arc::new(Egress {
            publisher: Arc::clone(&store.publisher),
            clients: crate::egress::EgressClients::new(cfg.upstream_ca.clone()),
            oauth: oauth.clone(),
        });
        let refresh = Arc::new(Refresher {
            store: store.clone(),
            health: Arc::clone(health),
            leases: Arc::clone(&leases),
            book: refresh::RefreshBook::default(),
            egress: Arc::clone(&egress),
        });
        let quota = Arc::new(Quota {
            store: store.clone(),
            egress: Arc::clone(&egress),
            refresh: Arc::clone(&refresh),
            usage: usage.clone(),
            credits: Arc::clone(&credits),
        });
        let catalog = Arc::new(Catalog {
            publisher: Arc::clone(&store.publisher),
            egress: Arc::clone(&egress),
            refresh: Arc::clone(&refresh),
            refresher: models::CatalogRefresher::new(
                catalog,
                cfg.model_aliases.clone(),
                ModelsClient::new(usage.clone(), cfg.models_url(), cfg.client_version.clone()),
                cfg.catalog_refresh_interval,
            ),
        });
        let accounts = Arc::new(Accounts {
            store: store.clone(),
            settle: Arc::clone(&settle),
            refresh: Arc::clone(&refresh),
            quota: Arc::clone(&quota),
            credits: Arc::clone(&credits),
            oauth: oauth.clone(),
            logins: PendingLogins::default(),
            board: cfg.scheduler_board,
        });
        let ops = Arc::new(Ops {
            accounts: Arc::clone(&accounts),
            health: Arc::clone(health),
            sampler: OpsSampler::new(cfg.metrics_url.clone()),
        });
        let forecast = Arc::new(Forecast {
            publisher: Arc::clone(&store.publisher),
            forecaster: crate::forecast::Forecaster::new(cfg.forecast_clock.clone()),
            credits,
        });
        let proxies = Arc::new(Proxies {
            store: store.clone(),
            oauth: oauth.clone(),
            upstream_ca: cfg.upstream_ca.clone(),
            upstream_base_url: cfg.upstream_base_url.clone(),
        });
        let pool = Arc::new(Pool {
            store: store.clone(),
            egress,
            usage,
            upstream_base_url: cfg.upstream_base_url.clone(),
        });
        let session = Arc::new(Session {
            storage: Arc::clone(&store.storage),
            auth: crate::auth::AdminAuth::new(
                cfg.admin_token.clone(),
                cfg.admin_listen,
                &cfg.admin_allowed_hosts,
            ),
        });
        Self {
            store,
            health: Arc::clone(health),
            leases,
            settle,
            refresh,
            quota,
            catalog,
            accounts,
            ops,
            forecast,
            proxies,
            pool,
            session,
            oauth,
        }
    }

    /// What the admin router hands its route modules.
    fn api(&self) -> ApiServices {
        ApiServices {
            store: self.store.clone(),
            health: Arc::clone(&self.health),
            session: Arc::clone(&self.session),
            accounts: Arc::clone(&self.accounts),
            ops: Arc::clone(&self.ops),
            catalog: Arc::clone(&self.catalog),
            proxies: Arc::clone(&self.proxies),
            forecast: Arc::clone(&self.forecast),
            pool: Arc::clone(&self.pool),
        }
    }
}

/// Starts every long-running task under the supervisor (names: the `task` label of
/// `codex_gateway_sidecar_task_restarts_total` and `/healthz`'s `sidecar.failing`); each
/// receives only the services it uses.
fn spawn_tasks(
    s: &Services,
    cfg: &SidecarConfig,
    events: shared_state::Events,
    listener: tokio::net::TcpListener,
    health: &Arc<Health>,
    stop: &watch::Receiver<bool>,
) -> Tasks {
    let sup = Supervisor::new(Arc::clone(health), stop.clone());
    // Each factory clones what a run needs; what must outlive a crashed run is shared.
    let events = Arc::new(events);
    // The admin listener's socket outlives a crashed server: each run serves a duplicate.
    let listener = listener.into_std().map(Arc::new);
    let server = sup.spawn("admin_server", {
        let (api, stop) = (s.api(), stop.clone());
        move || {
            let (services, stop) = (api.clone(), stop.clone());
            let listener = listener.as_ref().map_err(|e| e.to_string()).and_then(|l| {
                l.try_clone()
                    .and_then(tokio::net::TcpListener::from_std)
                    .map_err(|e| e.to_string())
            });
            async move {
                match listener {
                    Ok(l) => crate::api::serve(l, services, stop).await,
                    Err(e) => tracing::error!(error = %e, "admin listener unusable"),
                }
            }
        }
    });
    // The access log's writer outlives a crashed usage loop.
    let access = crate::access_log::AccessLog::start(&cfg.access_log, Arc::clone(events.stats()));
    // A run's spool adopts the file of a crashed run (unlocked once dropped) and replays it;
    // without one (the data directory is not writable) usage is kept in memory only.
    let usage = sup.spawn("events_usage", {
        let (store, events, stop) = (s.store.clone(), Arc::clone(&events), stop.clone());
        let (dir, usage_cfg) = (cfg.db.data_dir.clone(), cfg.usage);
        move || {
            let spool = match crate::spool::Spool::new(
                &dir,
                usage_cfg.spool_max_bytes,
                events::USAGE_MEM_CAP,
                Arc::clone(events.stats()),
            ) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::error!(error = %e, dir = %dir.display(), "cannot create the usage spool file; usage records are kept in memory only until stored");
                    None
                }
            };
            events::usage_loop(
                store.clone(),
                Arc::clone(&events),
                spool,
                usage_cfg,
                access.clone(),
                stop.clone(),
            )
        }
    });
    let control = sup.spawn("events_control", {
        let (store, settle, refresh) = (
            s.store.clone(),
            Arc::clone(&s.settle),
            Arc::clone(&s.refresh),
        );
        let (events, stop) = (Arc::clone(&events), stop.clone());
        move || {
            events::control_loop(
                store.clone(),
                Arc::clone(&settle),
                Arc::clone(&refresh),
                Arc::clone(&events),
                stop.clone(),
            )
        }
    });
    let limits = sup.spawn("key_limits", {
        let (store, health, leases) = (
            s.store.clone(),
            Arc::clone(&s.health),
            Arc::clone(&s.leases),
        );
        let stop = stop.clone();
        move || {
            key_limits::run(
                store.clone(),
                Arc::clone(&health),
                Arc::clone(&leases),
                stop.clone(),
            )
        }
    });
    let mut abortable = vec![
        sup.spawn("reload", {
            let (refresh, stop, every) =
                (Arc::clone(&s.refresh), stop.clone(), cfg.reload_interval);
            move || reload_loop(Arc::clone(&refresh), every, stop.clone())
        }),
        sup.spawn("health", {
            let (storage, health, leases) = (
                Arc::clone(&s.store.storage),
                Arc::clone(&s.health),
                Arc::clone(&s.leases),
            );
            let stop = stop.clone();
            let redis = cfg.redis_url.clone().filter(|u| !u.trim().is_empty());
            let ttl = cfg.refresh_lease_ttl;
            move || {
                health_loop(
                    Arc::clone(&storage),
                    Arc::clone(&health),
                    Arc::clone(&leases),
                    redis.clone(),
                    ttl,
                    stop.clone(),
                )
            }
        }),
        sup.spawn("forecast", {
            let (forecast, stop) = (Arc::clone(&s.forecast), stop.clone());
            move || forecast_loop(Arc::clone(&forecast), stop.clone())
        }),
        sup.spawn("auto_clean", {
            let (store, stop) = (s.store.clone(), stop.clone());
            move || crate::clean::run(store.clone(), stop.clone())
        }),
        sup.spawn("audit_prune", {
            let (storage, stop) = (Arc::clone(&s.store.storage), stop.clone());
            move || crate::audit::prune_loop(Arc::clone(&storage), stop.clone())
        }),
    ];
    // Fleet invalidations (`crate::pubsub`), only with Redis.
    if let Some(url) = cfg.redis_url.clone().filter(|u| !u.trim().is_empty()) {
        abortable.push(sup.spawn("pubsub", {
            let (store, leases, stop) = (s.store.clone(), Arc::clone(&s.leases), stop.clone());
            move || {
                crate::pubsub::run(
                    store.clone(),
                    Arc::clone(&leases),
                    url.clone(),
                    stop.clone(),
                )
            }
        }));
    }
    if let Some(dir) = cfg.auth_dir.clone() {
        abortable.push(sup.spawn("auth_dir", {
            let (store, oauth, stop) = (s.store.clone(), s.oauth.clone(), stop.clone());
            move || crate::auth_dir::run(store.clone(), oauth.clone(), dir.clone(), stop.clone())
        }));
    }
    if !cfg.quota_poll_interval.is_zero() {
        abortable.push(sup.spawn("quota", {
            let (quota, stop, every) =
                (Arc::clone(&s.quota), stop.clone(), cfg.quota_poll_interval);
            move || quota::run(Arc::clone(&quota), quota.usage.clone(), every, stop.clone())
        }));
    }
    if !cfg.catalog_refresh_interval.is_zero() {
        abortable.push(sup.spawn("models", {
            let (catalog, stop) = (Arc::clone(&s.catalog), stop.clone());
            move || models::run(Arc::clone(&catalog), stop.clone())
        }));
    }
    Tasks {
        server,
        usage,
        control,
        limits,
        abortable,
    }
}

async fn reload_loop(refresh: Arc<Refresher>, every: Duration, mut stop: watch::Receiver<bool>) {
    let store = &refresh.store;
    let every = if every.is_zero() {
        Duration::from_secs(2)
    } else {
        every
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if !refresh.health.storage_up() {
            // The probe says storage is down: a reload would hold the publisher's lock for
            // the pool's connect timeout, delaying a refresh's publish from memory. The probe
            // says when it is back (within HEALTH_INTERVAL).
            refresh::refresh_expiring(&refresh);
            continue;
        }
        match store
            .publisher
            .reload_quiet(store.storage.as_ref(), false)
            .await
        {
            Ok(_) => {
                if failing {
                    tracing::info!("snapshot reload recovered");
                }
                failing = false;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "snapshot reload failed; keeping the current snapshot");
                }
                failing = true;
            }
        }
        refresh::refresh_expiring(&refresh);
    }
}

/// Samples the pool's quota for the forecast every [`crate::forecast::TICK`] (publishing
/// the burn estimates the scheduler and `/metrics` read).
async fn forecast_loop(forecast: Arc<Forecast>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(crate::forecast::TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        forecast.forecaster.sample(&forecast.publisher.current());
    }
}

async fn health_loop(
    storage: Arc<dyn Storage>,
    health: Arc<Health>,
    leases: Leases,
    redis_url: Option<String>,
    lease_ttl: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(HEALTH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let up = matches!(
            tokio::time::timeout(HEALTH_INTERVAL, storage.ping()).await,
            Ok(Ok(()))
        );
        if up != health.storage_up() {
            if up {
                tracing::info!("storage is reachable again");
            } else {
                tracing::error!("storage is unreachable");
            }
        }
        health.set_storage_up(up);
        if leases.get().is_none() {
            if let Some(url) = redis_url.as_deref() {
                // Redis was down at start-up: connect now that it may be back.
                let connect = RedisLeases::connect(url, crate::lease::new_instance_id(), lease_ttl);
                match tokio::time::timeout(HEALTH_INTERVAL, connect)
                    .await
                    .unwrap_or_else(|_| {
                        Err(crate::error::SidecarError::Redis {
                            url: String::new(),
                            reason: "timed out".into(),
                        })
                    }) {
                    Ok(l) => {
                        tracing::info!("Redis is reachable; refresh leases are fleet-wide again");
                        let _ = leases.set(l);
                    }
                    Err(_) => health.set_redis_up(false),
                }
            }
        }
        if let Some(leases) = leases.get() {
            let up = matches!(
                tokio::time::timeout(HEALTH_INTERVAL, leases.ping()).await,
                Ok(true)
            );
            if health.redis_up() != Some(up) {
                if up {
                    tracing::info!("Redis is reachable");
                } else {
                    tracing::error!("Redis is unreachable");
                }
            }
            health.set_redis_up(up);
        }
    }
}
