//! A WebSocket client that floods pings and never reads (issue 28, high), in a test binary of
//! its own: the assertion is on this process's resident memory, which other tests running
//! beside it would disturb.

// Test helpers fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{io::Write, time::Duration};

use integration_tests::{
    raw::{ws_connect, ws_read_frame, ws_send_text},
    StackBuilder,
};

/// Resident memory of this process (the gateway runs in it), bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .map(|v| {
            v.trim()
                .trim_end_matches(" kB")
                .trim()
                .parse::<u64>()
                .unwrap()
                * 1024
        })
        .unwrap()
}

/// A client that floods pings and never reads used to grow the process without bound (one
/// queued pong per ping: 47 MB to 10 GB in 27 s). Now only the latest ping is answered and
/// the reader stops reading while the writer's queue is above its high-water mark: 512 MiB of
/// pings leave the process's memory where it was (a queued pong per ping grew it by about
/// 800 MiB), and the client, reading at last, finds
/// far fewer pongs than it sent pings. Both drivers.
#[test]
fn a_websocket_client_flooding_pings_without_reading_cannot_grow_the_process() {
    for legacy in [true, false] {
        let s = StackBuilder {
            legacy,
            tweak: Some(Box::new(|c| {
                c.gateway.client_write_timeout = Duration::from_secs(120);
            })),
            ..Default::default()
        }
        .start();
        let mut c = ws_connect(&s, Some(4096)).unwrap();
        c.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        let before = rss();
        let ping = [b'p'; 125];
        let pings = (512 << 20) / (ping.len() + 6);
        let mut batch = Vec::new();
        for _ in 0..1024 {
            let mask = [1u8, 2, 3, 4];
            batch.push(0x89);
            batch.push(0x80 | 125);
            batch.extend_from_slice(&mask);
            batch.extend(ping.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        }
        let mut sent = 0;
        while sent < pings {
            c.write_all(&batch).unwrap();
            sent += 1024;
        }
        let grown = rss().saturating_sub(before);
        // Other tests of this binary run alongside: the bound leaves them room.
        assert!(
            grown < 128 << 20,
            "legacy={legacy}: {sent} pings grew the process by {} MiB",
            grown >> 20
        );
        // The session is alive: a turn still streams, after whatever pongs were queued.
        ws_send_text(
            &mut c,
            br#"{"type":"response.create","model":"gpt-5.5","input":"hi"}"#,
        );
        let mut pongs = 0;
        loop {
            let (op, p) = ws_read_frame(&mut c).unwrap();
            match op {
                10 => pongs += 1,
                1 if String::from_utf8_lossy(&p).contains("response.completed") => break,
                1 => {}
                op => panic!("legacy={legacy}: opcode {op}"),
            }
        }
        assert!(pongs >= 1, "legacy={legacy}: pings are answered");
        assert!(
            pongs < sent / 4,
            "legacy={legacy}: {pongs} pongs for {sent} pings"
        );
    }
}
