use std::time::Duration;

use super::*;
use crate::testing::{Plan, SegmentedIo};

#[test]
fn parses_every_reply_kind_and_waits_for_more() {
    let wire =
        b"+OK\r\n-ERR no\r\n:42\r\n$3\r\nabc\r\n$-1\r\n$0\r\n\r\n*2\r\n$1\r\na\r\n:7\r\n*-1\r\n";
    let want = vec![
        Reply::Simple("OK".into()),
        Reply::Error("ERR no".into()),
        Reply::Integer(42),
        Reply::Bulk(Some(b"abc".to_vec())),
        Reply::Bulk(None),
        Reply::Bulk(Some(Vec::new())),
        Reply::Array(Some(vec![
            Reply::Bulk(Some(b"a".to_vec())),
            Reply::Integer(7),
        ])),
        Reply::Array(None),
    ];
    let mut got = Vec::new();
    let mut pos = 0;
    while pos < wire.len() {
        // Every proper prefix of the next reply asks for more bytes.
        let (r, used) = parse_reply(&wire[pos..]).unwrap().unwrap();
        for cut in 0..used {
            assert_eq!(
                parse_reply(&wire[pos..pos + cut]).unwrap(),
                None,
                "cut {cut}"
            );
        }
        got.push(r);
        pos += used;
    }
    assert_eq!(got, want);
}

#[test]
fn malformed_replies_are_errors_not_waits() {
    for bad in [
        &b"+OK\n"[..],
        b"?what\r\n",
        b"$abc\r\n",
        b"$3\r\nabcX\r\n",
        b":1x\r\n",
        b"$99999999999999999999\r\n",
    ] {
        assert!(
            parse_reply(bad).is_err(),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    // A huge declared length is refused before any wait for its bytes.
    assert!(parse_reply(format!("${}\r\n", MAX_REPLY + 1).as_bytes()).is_err());
}

#[test]
fn encodes_commands_as_bulk_arrays() {
    assert_eq!(
        encode(&[b"SET", b"k", b"v\r\n"]),
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n".to_vec()
    );
}

#[test]
fn urls_parse_with_credentials_and_database() {
    let t = RedisTarget::resolve("redis://127.0.0.1:6390/3").unwrap();
    assert_eq!(t.addr.port(), 6390);
    assert_eq!(t.db, 3);
    assert!(t.password.is_none());
    let t = RedisTarget::resolve("redis://:p%40ss@127.0.0.1").unwrap();
    assert_eq!(t.addr.port(), 6379);
    assert_eq!(t.password.as_ref().unwrap().expose(), "p@ss");
    assert!(t.user.is_none());
    let t = RedisTarget::resolve("redis://bob:pw@127.0.0.1:1/0").unwrap();
    assert_eq!(t.user.as_deref(), Some("bob"));
    assert!(!format!("{t:?}").contains("pw"), "no password in Debug");
    assert!(RedisTarget::resolve("rediss://127.0.0.1").is_err());
    assert!(RedisTarget::resolve("http://127.0.0.1").is_err());
    assert!(RedisTarget::resolve("redis://127.0.0.1/x").is_err());
}

/// Replies of a pipeline arrive in every segmentation; the connection reads exactly one
/// reply per command and keeps what follows for the next call.
#[monoio::test_all(timer_enabled = true)]
async fn pipelined_replies_split_at_every_boundary() {
    let wire = b"+OK\r\n$5\r\nhello\r\n$-1\r\n:1\r\n";
    let mut plans = Plan::standard(6, true);
    plans.push(Plan::Random { seed: 99, max: 3 });
    for plan in plans {
        let io = SegmentedIo::new(wire, plan);
        let mut conn = RespConn::new(io);
        let cmds = vec![
            encode(&[b"SET", b"a", b"b"]),
            encode(&[b"GET", b"a"]),
            encode(&[b"GET", b"zz"]),
        ];
        let r = conn.pipeline(&cmds).await.unwrap();
        assert_eq!(
            r,
            vec![
                Reply::Simple("OK".into()),
                Reply::Bulk(Some(b"hello".to_vec())),
                Reply::Bulk(None),
            ],
            "{plan:?}"
        );
        assert_eq!(
            conn.call(&[b"EXISTS", b"a"]).await.unwrap(),
            Reply::Integer(1)
        );
    }
}

/// A connection closed before the reply is complete is an error, never a hang.
#[monoio::test_all(timer_enabled = true)]
async fn a_truncated_reply_is_an_error() {
    let io = SegmentedIo::new(b"$10\r\nhel", Plan::EveryByte);
    let mut conn = RespConn::new(io);
    assert!(conn.call(&[b"GET", b"a"]).await.is_err());
}

/// Distinct keys for the tests against the real Redis: both drivers' copies of a test run at
/// once, and a `static` inside a test body would be one per copy (both counting from 0).
static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Against the real Redis of the test machine (skipped when none answers): set, read back
/// with a refreshed time to live, expire.
#[monoio::test_all(timer_enabled = true)]
async fn real_redis_round_trip() {
    if std::net::TcpStream::connect_timeout(
        &"127.0.0.1:6379".parse().unwrap(),
        Duration::from_millis(200),
    )
    .is_err()
    {
        eprintln!("no Redis on 127.0.0.1:6379; skipped");
        return;
    }
    let r = WorkerRedis::new(RedisTarget::resolve("redis://127.0.0.1:6379/0").unwrap());
    // Both drivers run this test at once: one key each.
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let key = format!("codex-gateway:test:{}:{n}", std::process::id()).into_bytes();
    let big = vec![b'x'; 300_000];
    r.set_px(&key, &big, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        r.get_ex(&key, Duration::from_secs(30)).await.unwrap(),
        Some(big)
    );
    r.pexpire_many(std::slice::from_ref(&key), Duration::from_millis(1))
        .await
        .unwrap();
    // The new time to live, read back (not waited for: a loaded Redis may serve a later GET
    // within its cached clock): at most 1 ms left, or already expired (-2).
    let ttl = r.pipeline(&[encode(&[b"PTTL", &key])]).await.unwrap();
    assert!(
        matches!(ttl.as_slice(), [Reply::Integer(t)] if *t <= 1 && *t != -1),
        "PTTL after PEXPIRE 1: {ttl:?}"
    );
    // A dead address fails fast and opens the breaker (later calls fail at once).
    let dead = WorkerRedis::new(RedisTarget::resolve("redis://127.0.0.1:1").unwrap());
    assert!(dead.get_ex(b"k", Duration::from_secs(1)).await.is_err());
    assert!(dead.breaker_open());
    assert!(dead.get_ex(b"k", Duration::from_secs(1)).await.is_err());
}

/// The ordered queue: commands reach Redis in submission order, each callback is told its
/// reply once; without a writer, or with the writer gone, callbacks are told `None`.
#[monoio::test_all(timer_enabled = true)]
async fn submitted_commands_run_in_order_and_every_callback_is_told() {
    use std::{cell::RefCell, rc::Rc};
    if std::net::TcpStream::connect_timeout(
        &"127.0.0.1:6379".parse().unwrap(),
        Duration::from_millis(200),
    )
    .is_err()
    {
        eprintln!("no Redis on 127.0.0.1:6379; skipped");
        return;
    }
    let r = Rc::new(WorkerRedis::new(
        RedisTarget::resolve("redis://127.0.0.1:6379/0").unwrap(),
    ));
    let got: Rc<RefCell<Vec<Option<Reply>>>> = Rc::default();
    let cb = |got: &Rc<RefCell<Vec<Option<Reply>>>>| -> Done {
        let got = Rc::clone(got);
        Box::new(move |reply| got.borrow_mut().push(reply))
    };
    // No writer yet: told at once.
    r.submit(encode(&[b"PING"]), cb(&got));
    assert_eq!(got.borrow().as_slice(), &[None]);
    got.borrow_mut().clear();
    r.start_writer();
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let key = format!("codex-gateway:test:q:{}:{n}", std::process::id()).into_bytes();
    r.submit(encode(&[b"SET", &key, b"10", b"PX", b"30000"]), cb(&got));
    for i in 1..=300i64 {
        // INCRBY then DECRBY of the same amount: only in order does every reply read back
        // 10 + i, then 10.
        let by = i.to_string();
        r.submit(encode(&[b"INCRBY", &key, by.as_bytes()]), cb(&got));
        r.submit(encode(&[b"DECRBY", &key, by.as_bytes()]), cb(&got));
    }
    for _ in 0..200 {
        if got.borrow().len() == 601 {
            break;
        }
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
    let got = got.borrow();
    assert_eq!(got.len(), 601);
    assert_eq!(got[0], Some(Reply::Simple("OK".into())));
    for i in 1..=300usize {
        assert_eq!(got[2 * i - 1], Some(Reply::Integer(10 + i as i64)));
        assert_eq!(got[2 * i], Some(Reply::Integer(10)));
    }
}
