//! The Codex CLI's ChatGPT-mode surface (`/backend-api/...`): the request sequence the real
//! Codex CLI 0.171.0 sends when logged in "with ChatGPT" (recorded by
//! `tests/fixtures/chatgpt-mode/record.py` into `codex-0.171.0-exec.jsonl`) replayed through
//! the gateway, the pool's `/wham/usage`, refusals without a key, and the real CLI in ChatGPT
//! mode (an `auth.json` whose access token is a gateway key, `chatgpt_base_url` and
//! `openai_base_url` at the gateway behind TLS) answering, resuming and running a tool on
//! both monoio drivers; plus the built-in provider with `CODEX_API_KEY`.
//!
//! The CLI only accepts an `https` workspace origin, so its tests put a TLS front (tokio-rustls,
//! a test CA from [`integration_tests::tls_material`]) before the gateway's plain listener, as
//! a reverse proxy does in production. The CLI tests need `CODEX_GATEWAY_TEST_CODEX` (set by
//! `tests/run.sh`); without it they print why they are skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

use base64::Engine;
use benches::{mock::DEFAULT_TEXT, RecordedRequest};
use integration_tests::{
    cli::{
        codex_bin, codex_command, codex_config, exec_args, exec_full_access_args, resume_last_args,
        run_bounded, tail, RUN_TIMEOUT,
    },
    client, parse_sse, Stack, StackBuilder,
};
use serde_json::Value;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/fixtures/chatgpt-mode/codex-0.171.0-exec.jsonl"
);
const MODEL: &str = "gpt-5.5";
/// The `account_id` of the CLI's `auth.json` (what it sends as `chatgpt-account-id`).
const CLI_ACCOUNT: &str = "acct-cli";

/// One recorded request.
struct Recorded {
    method: String,
    path: String,
    query: Option<String>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn fixture() -> Vec<Recorded> {
    std::fs::read_to_string(FIXTURE)
        .expect("fixture")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("fixture line");
            let body = if let Some(b) = v["body_b64"].as_str() {
                base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .expect("base64")
            } else if v.get("json").is_some() {
                serde_json::to_vec(&v["json"]).expect("json")
            } else {
                Vec::new()
            };
            Recorded {
                method: v["method"].as_str().expect("method").to_owned(),
                path: v["path"].as_str().expect("path").to_owned(),
                query: v["query"].as_str().map(str::to_owned),
                headers: v["headers"]
                    .as_array()
                    .expect("headers")
                    .iter()
                    .map(|h| {
                        (
                            h[0].as_str().expect("name").to_owned(),
                            h[1].as_str().expect("value").to_owned(),
                        )
                    })
                    .collect(),
                body,
            }
        })
        .collect()
}

fn header<'a>(r: &'a Recorded, name: &str) -> Option<&'a str> {
    r.headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn zstd_decode(b: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut d = ruzstd::decoding::StreamingDecoder::new(b).expect("zstd");
    let mut out = Vec::new();
    d.read_to_end(&mut out).expect("zstd body");
    out
}

/// Replays the recorded request (its bearer replaced by `key`, when it had one).
async fn replay(s: &Stack, r: &Recorded, key: Option<&str>) -> reqwest::Response {
    let url = match &r.query {
        Some(q) => format!("{}{}?{q}", s.url(), r.path),
        None => format!("{}{}", s.url(), r.path),
    };
    let method = reqwest::Method::from_bytes(r.method.as_bytes()).expect("method");
    let mut b = client().request(method, url);
    for (n, v) in &r.headers {
        if matches!(
            n.as_str(),
            "host" | "content-length" | "connection" | "transfer-encoding" | "authorization"
        ) {
            continue;
        }
        b = b.header(n, v);
    }
    if header(r, "authorization").is_some() {
        if let Some(k) = key {
            b = b.bearer_auth(k);
        }
    }
    if !r.body.is_empty() {
        b = b.body(r.body.clone());
    }
    b.send().await.expect("replayed request")
}

/// The recorded ChatGPT-mode sequence through the gateway: every route answered as the CLI
/// needs (workspace routing to the gateway's own origin, the Codex catalog, 404 side calls,
/// the zstd-compressed inference through the `/v1/responses` pipeline to the upstream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_sequence_replays_through_the_gateway() {
    let s = StackBuilder::default().start();
    let seq = fixture();
    assert!(seq.len() >= 10, "the recording holds the whole sequence");
    let host = s.app.data_addr.to_string();
    let mut seen = std::collections::BTreeSet::new();
    for r in seq
        .iter()
        .filter(|r| !(r.method == "GET" && r.path.ends_with("/codex/responses")))
    {
        let resp = replay(&s, r, Some(&s.key)).await;
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("body");
        let route = r.path.as_str();
        seen.insert(route.to_owned());
        match (r.method.as_str(), route) {
            ("GET", "/backend-api/wham/accounts/check") => {
                assert_eq!(status, 200, "{text}");
                let v: Value = serde_json::from_str(&text).expect("json");
                let acct = &v["accounts"][0];
                assert_eq!(acct["id"], CLI_ACCOUNT, "the CLI finds its own workspace");
                assert_eq!(acct["workspace_backend_origin"], format!("https://{host}"));
                assert_eq!(acct["account_routing_override"], "NO_CONSTRAINT");
            }
            ("GET", "/backend-api/codex/models") => {
                assert_eq!(status, 200, "{text}");
                let v: Value = serde_json::from_str(&text).expect("json");
                let models = v["models"].as_array().expect("the Codex catalog shape");
                assert!(models.iter().any(|m| m["slug"] == MODEL), "{MODEL} listed");
            }
            ("POST", "/backend-api/codex/responses") => {
                assert_eq!(status, 200, "{text}");
                let events = parse_sse(&text);
                assert_eq!(
                    events.last().map(|e| e.0.as_str()),
                    Some("response.completed")
                );
                assert!(text.contains(DEFAULT_TEXT), "the mock's answer");
            }
            _ => assert_eq!(status, 404, "{} {route}: {text}", r.method),
        }
    }
    for must in [
        "/backend-api/wham/accounts/check",
        "/backend-api/codex/models",
        "/backend-api/codex/responses",
        "/backend-api/ps/mcp",
    ] {
        assert!(seen.contains(must), "{must} is in the recording");
    }
    // The inference reached the upstream whole: the CLI's zstd body decoded, its input
    // intact, on the pool's account (never the CLI's own account id).
    let posted = seq
        .iter()
        .find(|r| r.method == "POST" && r.path == "/backend-api/codex/responses")
        .expect("inference in the recording");
    assert_eq!(header(posted, "content-encoding"), Some("zstd"));
    let sent: Value = serde_json::from_slice(&zstd_decode(&posted.body)).expect("json body");
    let ups = s.upstream_turns();
    assert_eq!(ups.len(), 1);
    let got = ups[0].json.as_ref().expect("upstream json");
    assert_eq!(
        got["input"].as_array().map(Vec::len),
        sent["input"].as_array().map(Vec::len)
    );
    assert_eq!(got["prompt_cache_key"], sent["prompt_cache_key"]);
    assert_eq!(ups[0].header("chatgpt-account-id"), Some("acct-0"));
    assert_eq!(
        ups[0].header("authorization"),
        Some(format!("Bearer {}", s.accounts[0].access_token).as_str())
    );
    assert_eq!(ups[0].header("session-id"), header(posted, "session-id"));
}

/// The recorded WebSocket upgrade (the built-in provider's first choice) is accepted on the
/// ChatGPT path, and a turn over it is served by the same session as `/v1/responses`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_websocket_upgrade_is_served() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};
    let s = StackBuilder::default().start();
    let seq = fixture();
    let up = seq
        .iter()
        .find(|r| r.method == "GET" && r.path == "/backend-api/codex/responses")
        .expect("the upgrade is recorded");
    let posted = seq
        .iter()
        .find(|r| r.method == "POST" && r.path == "/backend-api/codex/responses")
        .expect("inference in the recording");
    let mut req = format!("ws://{}{}", s.app.data_addr, up.path)
        .into_client_request()
        .expect("request");
    for (n, v) in &up.headers {
        if n.starts_with("sec-websocket")
            || matches!(
                n.as_str(),
                "host" | "connection" | "upgrade" | "authorization"
            )
        {
            continue;
        }
        req.headers_mut().insert(
            reqwest::header::HeaderName::from_bytes(n.as_bytes()).expect("name"),
            v.parse().expect("value"),
        );
    }
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", s.key).parse().expect("value"),
    );
    let (mut ws, resp) = tokio_tungstenite::connect_async(req)
        .await
        .expect("upgrade");
    assert_eq!(resp.status().as_u16(), 101);
    let mut body: Value = serde_json::from_slice(&zstd_decode(&posted.body)).expect("json");
    body["type"] = "response.create".into();
    ws.send(Message::text(body.to_string()))
        .await
        .expect("send");
    let mut text = String::new();
    while let Some(m) = ws.next().await {
        let Message::Text(t) = m.expect("frame") else {
            continue;
        };
        let v: Value = serde_json::from_str(&t).expect("event");
        if let Some(d) = v["delta"].as_str() {
            text.push_str(d);
        }
        if v["type"] == "response.completed" {
            break;
        }
        assert_ne!(v["type"], "error", "{t}");
    }
    assert_eq!(text, DEFAULT_TEXT);
}

/// Without a valid key the ChatGPT routes are refused with 401 in the upstream's error shape,
/// and nothing reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_valid_key_are_refused() {
    let s = StackBuilder::default().start();
    let guarded = [
        ("GET", "/backend-api/wham/accounts/check"),
        ("GET", "/backend-api/codex/models"),
        ("POST", "/backend-api/codex/responses"),
    ];
    let seq = fixture();
    for r in seq
        .iter()
        .filter(|r| guarded.contains(&(r.method.as_str(), r.path.as_str())))
    {
        for key in [None, Some("sk-not-a-gateway-key")] {
            let resp = replay(&s, r, key).await;
            assert_eq!(
                resp.status().as_u16(),
                401,
                "{} {} with {key:?}",
                r.method,
                r.path
            );
            let v: Value = resp.json().await.expect("json");
            assert!(v["error"]["message"].is_string(), "{v}");
            assert!(v["error"]["type"].is_string(), "{v}");
        }
    }
    for path in ["/backend-api/wham/usage", "/api/codex/usage"] {
        let resp = client()
            .get(format!("{}{path}", s.url()))
            .send()
            .await
            .expect("usage");
        assert_eq!(resp.status().as_u16(), 401);
    }
    assert!(s.upstream_turns().is_empty());
}

/// `/wham/usage` reports the pool: the mean use of the accounts that can serve, the soonest
/// reset, in the upstream's shape (integers); `limit_reached` once no account has quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wham_usage_reports_the_pools_combined_limits() {
    let s = StackBuilder {
        accounts: 2,
        ..Default::default()
    }
    .start();
    s.mock.set_quota("acct-0", 30.0, 10.0);
    s.mock.set_quota("acct-1", 50.0, 20.0);
    s.post_each_account("quota").await;
    let get = || async {
        let r = client()
            .get(format!("{}/backend-api/wham/usage", s.url()))
            .bearer_auth(&s.key)
            .header("chatgpt-account-id", CLI_ACCOUNT)
            .send()
            .await
            .expect("usage");
        assert_eq!(r.status().as_u16(), 200);
        r.json::<Value>().await.expect("json")
    };
    let v = get().await;
    let rl = &v["rate_limit"];
    assert_eq!(rl["primary_window"]["used_percent"], 40, "{v}");
    assert_eq!(rl["secondary_window"]["used_percent"], 15, "{v}");
    assert_eq!(rl["primary_window"]["limit_window_seconds"], 18_000);
    assert_eq!(rl["secondary_window"]["limit_window_seconds"], 604_800);
    assert!(rl["primary_window"]["reset_at"].as_i64().expect("reset_at") > 0);
    assert!(rl["primary_window"]["reset_after_seconds"].is_i64());
    assert_eq!(rl["allowed"], true);
    assert_eq!(rl["limit_reached"], false);
    assert_eq!(v["account_id"], CLI_ACCOUNT);
    assert!(v["plan_type"].is_string());
    assert_eq!(v["credits"]["has_credits"], false);
    // Both accounts out: the pool's limit is reached.
    s.mock.set_quota("acct-0", 100.0, 40.0);
    s.mock.set_quota("acct-1", 100.0, 40.0);
    s.post_each_account("quota").await;
    let v = get().await;
    assert_eq!(v["rate_limit"]["limit_reached"], true, "{v}");
    assert_eq!(v["rate_limit"]["allowed"], false);
    assert_eq!(v["rate_limit"]["primary_window"]["used_percent"], 100);
}

// === the real CLI in ChatGPT mode ===

/// A TLS front on loopback that forwards every connection to `target` (as a reverse proxy
/// terminating TLS before the gateway does). Stops when dropped.
struct TlsFront {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TlsFront {
    fn start(target: SocketAddr, cert: &Path, key: &Path) -> Self {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(
            &mut std::io::BufReader::new(std::fs::File::open(cert).expect("cert")),
        )
        .collect::<Result<_, _>>()
        .expect("certs");
        let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(
            &mut std::io::BufReader::new(std::fs::File::open(key).expect("key")),
        )
        .expect("key pem")
        .expect("a key");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    let (sock, _) = tokio::select! {
                        a = l.accept() => match a { Ok(a) => a, Err(_) => continue },
                        _ = &mut rx => return,
                    };
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        let Ok(mut tls) = acceptor.accept(sock).await else {
                            return;
                        };
                        let Ok(mut up) = tokio::net::TcpStream::connect(target).await else {
                            return;
                        };
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                    });
                }
            });
        });
        Self {
            addr,
            stop: Some(tx),
        }
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// An unsigned JWT (the CLI reads the id token's claims, never checks a signature).
fn fake_jwt(claims: &Value) -> String {
    let e = |v: &Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string().as_bytes())
    };
    format!(
        "{}.{}.sig",
        e(&serde_json::json!({"alg":"none","typ":"JWT"})),
        e(claims)
    )
}

/// A Codex CLI in ChatGPT mode pointed at the gateway through a TLS front.
struct ChatGptCli {
    bin: PathBuf,
    root: tempfile::TempDir,
    ca: PathBuf,
    _front: TlsFront,
    runs: usize,
}

impl ChatGptCli {
    fn new(bin: PathBuf, s: &Stack) -> Self {
        let root = tempfile::Builder::new()
            .prefix("codex-chatgpt-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("tempdir");
        for d in ["home", "codex-home", "work", "tls"] {
            std::fs::create_dir_all(root.path().join(d)).expect("mkdir");
        }
        let tls = integration_tests::tls_material(&root.path().join("tls"));
        let front = TlsFront::start(s.app.data_addr, &tls.cert, &tls.key);
        let base = format!("https://127.0.0.1:{}", front.addr.port());
        let top = format!(
            "chatgpt_base_url = \"{base}/backend-api/\"\nopenai_base_url = \"{base}/backend-api/codex\"\n"
        );
        let config = codex_config(MODEL, &top, "");
        std::fs::write(root.path().join("codex-home/config.toml"), config).expect("config");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let id_token = fake_jwt(&serde_json::json!({
            "email": "cli@codex-gateway.test",
            "exp": now + 365 * 86_400,
            "https://api.openai.com/auth": {
                "chatgpt_account_id": CLI_ACCOUNT,
                "chatgpt_plan_type": "pro",
                "chatgpt_user_id": "user-cli",
                "user_id": "user-cli",
            },
        }));
        // The gateway key rides where the CLI puts its access token.
        let auth = serde_json::json!({
            "auth_mode": "chatgpt",
            "OPENAI_API_KEY": null,
            "tokens": {
                "id_token": id_token,
                "access_token": s.key,
                "refresh_token": "not-used-by-the-gateway",
                "account_id": CLI_ACCOUNT,
            },
            "last_refresh": chrono_like_now(now),
        });
        std::fs::write(
            root.path().join("codex-home/auth.json"),
            serde_json::to_vec(&auth).expect("auth"),
        )
        .expect("auth.json");
        Self {
            bin,
            ca: tls.ca,
            root,
            _front: front,
            runs: 0,
        }
    }

    /// Runs `codex ARGS`; returns (success, stdout, stderr).
    fn run(&mut self, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
        self.runs += 1;
        let mut cmd = codex_command(&self.bin, self.root.path(), args);
        cmd.env("CODEX_CA_CERTIFICATE", &self.ca);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let what = format!("codex {args:?}");
        let f = run_bounded(
            &mut cmd,
            self.root.path(),
            self.runs,
            &what,
            RUN_TIMEOUT,
            String::new,
        );
        (f.status.success(), f.stdout, f.stderr)
    }
}

/// RFC 3339 for a Unix time (UTC), without a date crate.
fn chrono_like_now(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn assert_ran(what: &str, ok: bool, out: &str, err: &str, s: &Stack) {
    assert!(
        ok,
        "{what} failed; upstream saw {} request(s)\n--- stdout ---\n{out}\n--- stderr ---\n{}",
        s.upstream_turns().len(),
        tail(err, 6000)
    );
    assert!(
        !err.contains("workspace routing discovery failed"),
        "{what}: workspace routing failed\n{}",
        tail(err, 4000)
    );
    assert!(
        !err.contains("Falling back from WebSockets"),
        "{what}: the gateway's WebSocket was refused\n{}",
        tail(err, 4000)
    );
}

fn stack(legacy: bool) -> Stack {
    StackBuilder {
        legacy,
        ..Default::default()
    }
    .start()
}

/// One turn, then `resume --last`: both answered over the gateway's WebSocket on the
/// ChatGPT path; the second turn carries the first answer.
fn chatgpt_exec_and_resume(legacy: bool) {
    let Some(bin) = codex_bin() else { return };
    let s = stack(legacy);
    const FIRST: &str = "ChatGPT-mode answer from mock-codex: remember the word heron.";
    s.answer_once("acct-0", FIRST);
    let mut cli = ChatGptCli::new(bin, &s);
    let (ok, out, err) = cli.run(&exec_args("say hi"), &[]);
    assert_ran("codex exec (ChatGPT mode)", ok, &out, &err, &s);
    assert!(out.contains(FIRST), "the answer is printed\n{out}");
    let (ok, out, err) = cli.run(&resume_last_args("and again"), &[]);
    assert_ran(
        "codex exec resume --last (ChatGPT mode)",
        ok,
        &out,
        &err,
        &s,
    );
    assert!(out.contains(DEFAULT_TEXT), "the second answer\n{out}");
    let ups = s.upstream_turns();
    assert_eq!(ups.len(), 2, "two turns upstream");
    for u in &ups {
        assert_eq!(
            u.header("chatgpt-account-id"),
            Some("acct-0"),
            "the pool's account"
        );
    }
    let second = ups[1].json.as_ref().expect("json");
    let text = second["input"].to_string();
    assert!(
        text.contains(FIRST) || second.get("previous_response_id").is_some(),
        "the resumed turn carries the first answer (or continues it on the same socket)"
    );
    assert!(text.contains("and again"));
    let served = s
        .app
        .registry
        .render()
        .lines()
        .find_map(|l| {
            l.strip_prefix("codex_gateway_requests_total{route=\"responses\",status=\"101\"} ")
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    assert!(
        served >= 2,
        "the CLI's turns went over the gateway's WebSocket ({served})"
    );
}

/// A tool call: the CLI runs `exec_command` and sends its output back through the gateway.
fn chatgpt_tool_round_trip(legacy: bool) {
    let Some(bin) = codex_bin() else { return };
    let s = stack(legacy);
    s.answer_with_tool_call(
        "acct-0",
        "exec_command",
        r#"{"cmd":"echo chatgpt-tool-ok"}"#,
        1,
    );
    let mut cli = ChatGptCli::new(bin, &s);
    let (ok, out, err) = cli.run(&exec_full_access_args("run echo chatgpt-tool-ok"), &[]);
    assert_ran(
        "codex exec tool round trip (ChatGPT mode)",
        ok,
        &out,
        &err,
        &s,
    );
    assert!(out.contains(DEFAULT_TEXT), "the follow-up answer\n{out}");
    let ups = s.upstream_turns();
    assert_eq!(ups.len(), 2, "the call, then its output");
    let items = ups[1].json.as_ref().expect("json")["input"].to_string();
    assert!(
        items.contains("function_call_output") && items.contains("chatgpt-tool-ok"),
        "the tool's output went back upstream: {}",
        tail(&items, 2000)
    );
}

#[test]
fn chatgpt_mode_exec_and_resume_io_uring() {
    chatgpt_exec_and_resume(false);
}

#[test]
fn chatgpt_mode_exec_and_resume_legacy() {
    chatgpt_exec_and_resume(true);
}

#[test]
fn chatgpt_mode_tool_round_trip_io_uring() {
    chatgpt_tool_round_trip(false);
}

#[test]
fn chatgpt_mode_tool_round_trip_legacy() {
    chatgpt_tool_round_trip(true);
}

/// The built-in provider with an API key (`CODEX_API_KEY` = a gateway key) and
/// `openai_base_url` at the gateway's ChatGPT path, no `auth.json`: answered.
#[test]
fn builtin_provider_with_codex_api_key() {
    let Some(bin) = codex_bin() else { return };
    let s = stack(false);
    let mut cli = ChatGptCli::new(bin, &s);
    std::fs::remove_file(cli.root.path().join("codex-home/auth.json")).expect("rm auth.json");
    let key = s.key.clone();
    let (ok, out, err) = cli.run(&exec_args("say hi"), &[("CODEX_API_KEY", key.as_str())]);
    assert!(
        ok,
        "--- stdout ---\n{out}\n--- stderr ---\n{}",
        tail(&err, 6000)
    );
    assert!(out.contains(DEFAULT_TEXT), "{out}");
    assert_eq!(s.upstream_turns().len(), 1);
}

/// Issues 23 and 24 with the real client: the Codex CLI in ChatGPT mode compacts remotely
/// through the gateway (remote compaction v2: a WebSocket turn ending in
/// `compaction_trigger`, answered with one account-bound `compaction` item that replaces the
/// history), and when the account that minted it runs dry the session continues on the other
/// account, which never receives the foreign blob.
#[test]
fn chatgpt_mode_survives_an_account_switch_after_a_remote_compaction() {
    let Some(bin) = codex_bin() else { return };
    let s = StackBuilder {
        accounts: 2,
        strategy: Some(shared_state::snapshot::Strategy::FillFirst),
        ..Default::default()
    }
    .start();
    for a in ["acct-0", "acct-1"] {
        s.mock.set_behaviour(a, "reasoning=1".parse().unwrap());
    }
    let mut cli = ChatGptCli::new(bin, &s);
    // A tiny auto-compaction limit: the CLI compacts before its second turn.
    let compact = ["-c", "model_auto_compact_token_limit=50"];
    let run = |cli: &mut ChatGptCli, args: &[&str]| {
        let mut all: Vec<&str> = vec!["exec"];
        all.extend_from_slice(&compact);
        all.extend_from_slice(args);
        cli.run(&all, &[])
    };
    let (ok, out, err) = run(&mut cli, &["--skip-git-repo-check", "say hi"]);
    assert_ran("codex exec (ChatGPT mode)", ok, &out, &err, &s);
    let (ok, out, err) = run(
        &mut cli,
        &["resume", "--last", "--skip-git-repo-check", "and again"],
    );
    assert_ran("codex exec resume (compacting)", ok, &out, &err, &s);
    assert!(
        err.contains("context compacted") || out.contains("context compacted"),
        "the CLI compacted\n{}",
        tail(&err, 3000)
    );
    let ups = s.upstream_turns();
    let last_type = |u: &RecordedRequest| -> String {
        u.json
            .as_ref()
            .and_then(|j| j["input"].as_array())
            .and_then(|a| a.last())
            .and_then(|i| i["type"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let carries = |u: &RecordedRequest, ty: &str| -> bool {
        u.json
            .as_ref()
            .and_then(|j| j["input"].as_array())
            .is_some_and(|a| a.iter().any(|i| i["type"] == ty))
    };
    assert!(
        ups.iter().any(|u| last_type(u) == "compaction_trigger"),
        "a remote compaction v2 request went upstream"
    );
    assert!(
        ups.iter().any(|u| carries(u, "compaction")),
        "the next turn carries the compaction item"
    );
    assert!(
        ups.iter().all(|u| u.account_id() == Some("acct-0")),
        "all on the first account so far"
    );
    // The account that minted the compaction runs dry between turns.
    s.mock
        .set_behaviour("acct-0", "error=usage_limit_reached".parse().unwrap());
    s.mock.clear_requests();
    let (ok, out, err) = run(
        &mut cli,
        &[
            "resume",
            "--last",
            "--skip-git-repo-check",
            "and a third time",
        ],
    );
    assert_ran("codex exec resume (after the switch)", ok, &out, &err, &s);
    assert!(out.contains(DEFAULT_TEXT), "the third answer\n{out}");
    let ups = s.upstream_turns();
    let on_1: Vec<&RecordedRequest> = ups
        .iter()
        .filter(|u| u.account_id() == Some("acct-1"))
        .collect();
    assert!(!on_1.is_empty(), "the session moved to acct-1");
    for u in &on_1 {
        assert!(
            u.foreign_blobs().is_empty(),
            "acct-1 received a foreign blob: {}",
            u.body_text()
        );
    }
    // The CLI compacts again on acct-1 (its limit is tiny): whatever compaction item acct-1
    // receives is its own (foreign_blobs above), and it answers.
    assert!(on_1
        .last()
        .unwrap()
        .body_text()
        .contains("and a third time"));
}
