//! Egress proxy storage (issue 14) on both backends: the password sealed and bound to the
//! proxy's name, assignments, the start-up key check and `secrets rotate` covering it, and the
//! publisher putting each account's egress in the snapshot.

use std::sync::Arc;

use admin::{
    publish::Publisher,
    storage::{
        proxies::{ProxyAssignment, ProxyCheck, ProxyWrite},
        AccountUpsert,
    },
};
use shared_state::{channels, ProxyUrl, Secret, Settings, Snapshot};

use crate::support::{both_backends, jwt, TestDb, FAR_EXP};

fn write(name: &str, url: &str, pool: Option<&str>) -> ProxyWrite {
    ProxyWrite {
        name: name.into(),
        url: ProxyUrl::parse(url).unwrap(),
        pool: pool.map(Into::into),
        enabled: true,
    }
}

async fn proxies_stored_sealed_assigned_and_published(db: &TestDb) {
    let s = db.open().await;
    let acc = s
        .upsert_account(&AccountUpsert {
            chatgpt_account_id: "acc-p".into(),
            user_id: "u".into(),
            email: None,
            plan_type: None,
            access_token: Secret::new(jwt("acc-p", "u", "p@x", "plus", FAR_EXP)),
            refresh_token: Secret::new("rt"),
            id_token: Secret::new(""),
            access_expires_at: Some(FAR_EXP),
            last_refresh_at: None,
        })
        .await
        .unwrap()
        .id;
    let store = s.proxies();
    let a = store
        .create_proxy(&write(
            "a",
            "socks5h://bob:pw%40A@10.0.0.1:1080",
            Some("eu"),
        ))
        .await
        .unwrap();
    let b = store
        .create_proxy(&write("b", "http://127.0.0.1:3128", Some("eu")))
        .await
        .unwrap();
    let rows = store.list_proxies().await.unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].url, "socks5h://bob@10.0.0.1:1080");
    assert_eq!(rows[0].password.as_ref().map(|p| p.expose()), Some("pw@A"));
    assert!(!rows[0].decrypt_failed);
    assert_eq!(rows[1].password, None);
    // A rename re-seals the password under the new name.
    let mut w = write("a2", "socks5h://bob:pw%40A@10.0.0.1:1080", Some("eu"));
    w.enabled = true;
    assert!(store.update_proxy(a, &w).await.unwrap());
    let rows = store.list_proxies().await.unwrap();
    assert_eq!(rows[0].name, "a2");
    assert_eq!(rows[0].password.as_ref().map(|p| p.expose()), Some("pw@A"));
    store
        .record_proxy_check(
            b,
            &ProxyCheck {
                ok: false,
                latency_ms: 12,
                error: Some("refused".into()),
                at: 5,
            },
        )
        .await
        .unwrap();
    let rows = store.list_proxies().await.unwrap();
    assert_eq!(
        (
            rows[1].last_check_ok,
            rows[1].last_check_ms,
            rows[1].last_check_at
        ),
        (Some(false), Some(12), Some(5))
    );

    // Assignments and what the publisher makes of them.
    let snapshot = Snapshot::shared();
    let (mb, _rx) = channels::mailboxes(1);
    let publisher = Publisher::new(Arc::clone(&snapshot), mb, Settings::default());
    publisher.reload(s.as_ref(), true).await.unwrap();
    assert!(
        snapshot.load().account(acc).unwrap().egress.is_none(),
        "direct"
    );
    store
        .set_account_proxy(acc, &ProxyAssignment::Proxy(a))
        .await
        .unwrap();
    assert_eq!(
        store.list_proxy_assignments().await.unwrap(),
        vec![(acc, ProxyAssignment::Proxy(a))]
    );
    publisher.reload(s.as_ref(), false).await.unwrap();
    let snap = snapshot.load();
    let e = snap.account(acc).unwrap().egress.clone().unwrap();
    assert_eq!((e.id, e.name.as_str(), e.usable), (a, "a2", true));
    assert_eq!(e.addrs, vec!["10.0.0.1:1080".parse().unwrap()]);
    assert!(
        !format!("{:?}", snap.account(acc).unwrap()).contains("pw@A"),
        "Debug redacts the password"
    );
    // A pool: one of its proxies; a disabled proxy: unusable, never direct.
    store
        .set_account_proxy(acc, &ProxyAssignment::Pool("eu".into()))
        .await
        .unwrap();
    publisher.reload(s.as_ref(), false).await.unwrap();
    let id = snapshot
        .load()
        .account(acc)
        .unwrap()
        .egress
        .as_ref()
        .unwrap()
        .id;
    assert!(id == a || id == b);
    let mut off = write("b", "http://127.0.0.1:3128", Some("eu"));
    off.enabled = false;
    store.update_proxy(b, &off).await.unwrap();
    w.enabled = false;
    store.update_proxy(a, &w).await.unwrap();
    publisher.reload(s.as_ref(), false).await.unwrap();
    let e = snapshot
        .load()
        .account(acc)
        .unwrap()
        .egress
        .clone()
        .unwrap();
    assert!(
        !e.usable,
        "a pool without an enabled proxy is unusable, not direct"
    );
    store
        .set_account_proxy(acc, &ProxyAssignment::Direct)
        .await
        .unwrap();
    assert!(store.list_proxy_assignments().await.unwrap().is_empty());
    assert!(store.delete_proxy(b).await.unwrap());
    s.close().await.unwrap();

    // The proxy password is part of the key check and of the rotation.
    let target = db.target();
    let rotated = tokio::task::spawn_blocking(move || admin::cli::secrets_rotate(&target, None))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        rotated.columns, 3,
        "two token columns and one proxy password"
    );
    let s = db.open().await;
    let rows = s.proxies().list_proxies().await.unwrap();
    assert_eq!(rows[0].password.as_ref().map(|p| p.expose()), Some("pw@A"));
    s.close().await.unwrap();
    std::fs::write(
        db.target().data_dir.join("secret.key"),
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [9u8; 32]),
    )
    .unwrap();
    assert!(matches!(
        admin::storage::open(&db.target()).await,
        Err(admin::StorageError::KeyMismatch { .. })
    ));
}

both_backends!(proxies_stored_sealed_assigned_and_published);
