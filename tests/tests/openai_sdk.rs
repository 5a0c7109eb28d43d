//! The official OpenAI Python SDK through the gateway in front of mock-codex.
//! Needs `CODEX_GATEWAY_TEST_PYTHON` (set by `tests/run.sh`) or a `python3` with `openai`.

use std::process::Command;

use integration_tests::StackBuilder;

fn python() -> String {
    if let Ok(p) = std::env::var("CODEX_GATEWAY_TEST_PYTHON") {
        return p;
    }
    let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/py-venv/bin/python");
    if std::path::Path::new(venv).exists() {
        return venv.to_owned();
    }
    "python3".to_owned()
}

fn run_script(script: &str, base: &str, key: &str) {
    let py = python();
    let path = format!("{}/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&py)
        .arg(&path)
        .arg(base)
        .arg(key)
        .env("NO_PROXY", "*")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {py} (run tests/run.sh to prepare the venv): {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} failed (python: {py}; run tests/run.sh to install the OpenAI SDK)\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
}

#[test]
fn openai_python_sdk_responses() {
    let s = StackBuilder::default().start();
    run_script("sdk_responses.py", &format!("{}/v1", s.url()), &s.key);
}

#[test]
fn openai_python_sdk_chat_and_models() {
    let s = StackBuilder::default().start();
    // The script's first request is the tool-call round trip.
    s.mock.set_behaviour(
        "acct-0",
        benches::Behaviour {
            tool_call: Some("get_weather".into()),
            tool_arguments: Some(r#"{"city":"Paris"}"#.into()),
            ..Default::default()
        }
        .times(1),
    );
    run_script("sdk_chat.py", &format!("{}/v1", s.url()), &s.key);
    // What the SDK's structured-output and tool requests became upstream.
    let bodies: Vec<serde_json::Value> = s
        .mock
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/responses"))
        .filter_map(|r| serde_json::from_slice(&r.body).ok())
        .collect();
    assert!(
        bodies
            .iter()
            .any(|b| b["text"]["format"]["type"] == "json_schema"
                && b["text"]["format"]["name"] == "answer"
                && b["text"]["format"]["schema"]["properties"]["city"].is_object()),
        "response_format json_schema -> text.format"
    );
    assert!(bodies
        .iter()
        .any(|b| b["tools"][0]["name"] == "get_weather" && b["tools"][0]["type"] == "function"));
    assert!(bodies
        .iter()
        .any(|b| b["input"].as_array().is_some_and(|i| i
            .iter()
            .any(|it| it["type"] == "function_call_output" && it["output"] == "sunny"))));
}
