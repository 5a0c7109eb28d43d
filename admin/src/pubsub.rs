//! Fleet invalidations over Redis pub/sub: what one instance changes reaches the others in
//! milliseconds instead of at their next periodic reload.
//!
//! # Key Components
//! - [`CHANNEL`]: one channel for the whole fleet; a message is the sender's instance id
//!   (its own messages are ignored). It says only "storage changed, reload": the receiver
//!   reads everything from the database, so a message carries no state and losing one costs
//!   at most the periodic reload.
//! - [`run`]: two loops of the sidecar, both only when `redis_url` is set:
//!   - the publisher waits for [`crate::publish::Publisher::announced`] (an admin mutation, a
//!     refresh, a persisted cooldown or status: announcements coalesce) and `PUBLISH`es on the
//!     lease connection ([`crate::lease::RedisLeases`]);
//!   - the subscriber holds its own connection, `SUBSCRIBE`s and on each message from another
//!     instance runs [`crate::publish::Publisher::reload_quiet`] (coalesced: messages that
//!     arrive during a reload cause one more reload). The reload republishes a changed
//!     snapshot and applies the stored cooldowns and statuses to the live atomics.
//!
//! # Error handling
//! Redis down stops nothing: the publisher drops announcements while there is no connection
//! (the periodic reload is the fallback), and the subscriber reconnects every
//! [`RECONNECT`], reloading once after each (re)subscription to catch up on what it missed.

use std::{sync::Arc, time::Duration};

use futures_util::StreamExt;
use tokio::sync::{watch, Notify};

use crate::services::{Leases, Store};

/// The fleet's invalidation channel.
pub const CHANNEL: &str = "codex-gateway:invalidate";
/// Pause between two connection attempts of the subscriber.
pub const RECONNECT: Duration = Duration::from_secs(1);
/// Bound of one connect + `SUBSCRIBE`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Runs the publisher and the subscriber until `stop`.
pub(crate) async fn run(
    store: Store,
    leases: Leases,
    redis_url: String,
    stop: watch::Receiver<bool>,
) {
    let instance = crate::lease::new_instance_id();
    let wake = Arc::new(Notify::new());
    let reloader = tokio::spawn(reload_loop(store.clone(), Arc::clone(&wake), stop.clone()));
    let publisher = tokio::spawn(publish_loop(
        store.clone(),
        leases,
        instance.clone(),
        stop.clone(),
    ));
    subscribe_loop(&redis_url, &instance, &wake, stop).await;
    publisher.abort();
    reloader.abort();
}

async fn publish_loop(
    store: Store,
    leases: Leases,
    instance: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut failing = false;
    loop {
        tokio::select! {
            () = store.publisher.announced() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        // Without a connection (Redis down at start-up) the periodic reload carries it.
        let Some(leases) = leases.get() else {
            continue;
        };
        let mut conn = leases.connection();
        let sent = redis::cmd("PUBLISH")
            .arg(CHANNEL)
            .arg(&instance)
            .query_async::<i64>(&mut conn)
            .await;
        match sent {
            Ok(_) if failing => {
                failing = false;
                tracing::info!("fleet invalidations are published again");
            }
            Ok(_) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "cannot publish a fleet invalidation (the other instances see the change at their next reload)");
            }
            Err(_) => {}
        }
    }
}

async fn subscribe_loop(url: &str, instance: &str, wake: &Notify, mut stop: watch::Receiver<bool>) {
    let mut failing = false;
    loop {
        let session = async {
            let client = redis::Client::open(url)?;
            let mut ps = tokio::time::timeout(CONNECT_TIMEOUT, async {
                let mut ps = client.get_async_pubsub().await?;
                ps.subscribe(CHANNEL).await?;
                Ok::<_, redis::RedisError>(ps)
            })
            .await
            .map_err(|_| {
                redis::RedisError::from((redis::ErrorKind::IoError, "connect timed out"))
            })??;
            if failing {
                tracing::info!("fleet invalidations are received again");
            }
            // Whatever was announced while we were not listening.
            wake.notify_one();
            let mut messages = ps.on_message();
            while let Some(msg) = messages.next().await {
                let from: String = msg.get_payload().unwrap_or_default();
                if from != instance {
                    tracing::debug!(from = %from, "fleet invalidation");
                    wake.notify_one();
                }
            }
            Err::<(), _>(redis::RedisError::from((
                redis::ErrorKind::IoError,
                "subscription closed",
            )))
        };
        let res = tokio::select! {
            r = session => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        if let Err(e) = res {
            if !failing {
                tracing::warn!(error = %e, "fleet invalidations unavailable (Redis); reconnecting, the periodic reload carries changes meanwhile");
            }
            failing = true;
        }
        tokio::select! {
            () = tokio::time::sleep(RECONNECT) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

async fn reload_loop(store: Store, wake: Arc<Notify>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = wake.notified() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if let Err(e) = store
            .publisher
            .reload_quiet(store.storage.as_ref(), false)
            .await
        {
            tracing::debug!(error = %e, "reload after a fleet invalidation failed");
        }
    }
}
