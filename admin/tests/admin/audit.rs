//! The audit log's retention (issue 27): entries older than `audit_retention_days` are
//! deleted by the sidecar's prune (`admin::audit::prune_stored`), by `at_ms` through its
//! index and in batches; newer entries stay; 0 keeps everything. On SQLite and PostgreSQL.

use admin::{
    audit::{prune, prune_stored, ACTOR_RETENTION},
    settings::RetentionDays,
    storage::audit::{AuditFilter, AuditWrite, PRUNE_BATCH},
};

use crate::support::{both_backends, TestDb};

const DAY: i64 = 86_400_000;

fn entry(at_ms: i64, actor: &str) -> AuditWrite {
    AuditWrite {
        at_ms,
        actor: actor.to_owned(),
        action: "keys.update".into(),
        object_type: Some("key".into()),
        object_id: Some("1".into()),
        status: 200,
        ..AuditWrite::default()
    }
}

async fn actors(s: &dyn admin::storage::Storage) -> Vec<String> {
    let mut v: Vec<String> = s
        .audit()
        .list_audit(&AuditFilter::default(), 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.entry.actor)
        .collect();
    v.sort();
    v
}

async fn prune_deletes_only_entries_past_the_retention(db: &TestDb) {
    let s = db.open().await;
    let now = shared_state::now_ms() as i64;
    for (age_days, actor) in [
        (400, "old-400"),
        (31, "old-31"),
        (29, "new-29"),
        (0, "new-0"),
    ] {
        s.audit()
            .append_audit(&entry(now - age_days * DAY, actor))
            .await
            .unwrap();
    }
    // Off (0 = keep forever): nothing goes.
    s.write_settings(&[("audit_retention_days".into(), Some("0".into()))])
        .await
        .unwrap();
    assert_eq!(prune_stored(s.as_ref(), now).await.unwrap(), 0);
    assert_eq!(actors(s.as_ref()).await.len(), 4);
    // The default (180 days) takes the 400-day-old entry only.
    s.write_settings(&[("audit_retention_days".into(), None)])
        .await
        .unwrap();
    assert_eq!(prune_stored(s.as_ref(), now).await.unwrap(), 1);
    assert_eq!(
        actors(s.as_ref()).await,
        vec![ACTOR_RETENTION, "new-0", "new-29", "old-31"],
        "the prune is itself recorded"
    );
    // 30 days: the 31-day-old entry goes; the 29-day-old one and the newer stay.
    s.write_settings(&[("audit_retention_days".into(), Some("30".into()))])
        .await
        .unwrap();
    assert_eq!(prune_stored(s.as_ref(), now).await.unwrap(), 1);
    let left = actors(s.as_ref()).await;
    assert!(!left.iter().any(|a| a.starts_with("old-")), "{left:?}");
    assert!(left.iter().any(|a| a == "new-29") && left.iter().any(|a| a == "new-0"));
    // A second prune finds nothing (and records nothing).
    let before = left.len();
    assert_eq!(prune_stored(s.as_ref(), now).await.unwrap(), 0);
    assert_eq!(actors(s.as_ref()).await.len(), before);
    let prunes = s
        .audit()
        .list_audit(
            &AuditFilter {
                action: Some("audit.prune".into()),
                ..AuditFilter::default()
            },
            10,
        )
        .await
        .unwrap();
    assert_eq!(prunes.len(), 2);
    assert!(prunes[0]
        .entry
        .details
        .as_deref()
        .unwrap()
        .contains("\"deleted\":1"));
}

/// More old entries than one batch deletes: the prune repeats until none is left.
async fn prune_repeats_its_batches(db: &TestDb) {
    let s = db.open().await;
    let n = PRUNE_BATCH + 7;
    // Many rows at once, straight into the table (the storage layer appends one at a time).
    db.raw_exec(
        &format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {n}) \
             INSERT INTO audit_log (at_ms, actor, action, status) \
             SELECT 1000 + i, 'bulk-old', 'x.y', 0 FROM n"
        ),
        &[],
    )
    .await;
    s.audit()
        .append_audit(&entry(10 * DAY, "kept"))
        .await
        .unwrap();
    let deleted = prune(s.as_ref(), RetentionDays(1), 10 * DAY).await.unwrap();
    assert_eq!(deleted, n.unsigned_abs());
    assert_eq!(actors(s.as_ref()).await, vec![ACTOR_RETENTION, "kept"]);
}

both_backends!(
    prune_deletes_only_entries_past_the_retention,
    prune_repeats_its_batches,
);
