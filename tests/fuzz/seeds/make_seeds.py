#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/*/seed-*): real request
shapes from docs/protocol.md#what-real-clients-send (Codex CLI 0.171.0 over HTTP, the OpenAI and Anthropic SDKs),
Codex SSE streams as the mock upstream sends them, WebSocket frames (masked, fragmented,
permessage-deflate), RESP2 replies and credential files. Re-run after changing it; files
it does not write are left alone: regress-* (inputs that once failed) and
seed-codex-cli-0.171.0-recorded (a request the real Codex CLI 0.171.0 sent, `codex exec "say
hi"` against a local listener, recorded byte for byte)."""
import base64, json, os, struct, zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


UUID = "0199a213-81c0-7800-8aa1-bbab2a035a53"
TURN_META = json.dumps({"installation_id": "5f1c2a", "session_id": UUID, "thread_id": UUID,
                        "turn_id": "t1", "window_id": UUID + ":0", "request_kind": "turn",
                        "turn_trigger": "exec", "sandbox": "read-only", "model": "gpt-5.5",
                        "reasoning_effort": "low"}, separators=(",", ":"))


def cli_body(n_tools=2):
    tools = [{"type": "function", "name": "exec_command", "description": "Runs a command.",
              "strict": False, "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                                              "required": ["cmd"], "additionalProperties": False}},
             {"type": "web_search"}][:n_tools]
    return json.dumps({
        "model": "gpt-5.5", "stream": True,
        "input": [
            {"type": "message", "id": "msg_1", "role": "developer",
             "content": [{"type": "input_text", "text": "You are Codex, a coding agent."}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "<environment_context>cwd=/work</environment_context>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say hi"}]},
            {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "Process exited with code 0"},
        ],
        "tools": tools, "tool_choice": "auto", "parallel_tool_calls": True,
        "reasoning": {"effort": "low", "summary": "auto"}, "store": False,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": UUID,
        "text": {"verbosity": "low"},
        "client_metadata": {"thread_id": UUID, "session_id": UUID, "turn_id": "t1",
                            "x-codex-turn-metadata": TURN_META},
    }, separators=(",", ":"))


def cli_head(extra=""):
    return ("POST /v1/responses HTTP/1.1\r\nhost: 127.0.0.1:8080\r\nauthorization: Bearer sk-cg-test\r\n"
            "accept: text/event-stream\r\ncontent-type: application/json\r\naccept-encoding: zstd,gzip\r\n"
            "originator: codex_exec\r\n"
            "user-agent: codex_exec/0.171.0 (Debian 12.0.0; x86_64) xterm (codex_exec; 0.171.0)\r\n"
            f"session-id: {UUID}\r\nthread-id: {UUID}\r\nx-client-request-id: {UUID}\r\n"
            f"x-codex-window-id: {UUID}:0\r\nx-codex-beta-features: remote_compaction_v2\r\n"
            f"x-codex-turn-metadata: {TURN_META}\r\n" + extra + "\r\n")


def chunked(body, sizes=(1, 7, 64, 500)):
    out, i, k = b"", 0, 0
    while i < len(body):
        n = sizes[k % len(sizes)]
        part = body[i:i + n]
        ext = ";ext=1" if k % 3 == 2 else ""
        out += b"%x%s\r\n" % (len(part), ext.encode()) + part + b"\r\n"
        i, k = i + n, k + 1
    return out + b"0\r\nx-trailer: yes\r\n\r\n"


# --- h1: [max segment, seed] + what the client sends ----------------------------------------
body = cli_body().encode()
put("h1", "codex-cli-length", bytes([0, 1]) + cli_head(f"content-length: {len(body)}\r\n").encode() + body)
put("h1", "codex-cli-chunked", bytes([16, 2]) + cli_head("transfer-encoding: chunked\r\n").encode() + chunked(body))
chat = json.dumps({"model": "gpt-5.5", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
put("h1", "pipelined", bytes([7, 3]) +
    b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer sk-cg-x\r\n\r\n" +
    b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % len(chat) + chat +
    b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
put("h1", "websocket-upgrade", bytes([0, 4]) +
    b"GET /v1/responses HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
    b"openai-beta: responses_websockets=2026-02-06\r\n\r\n")
put("h1", "te-and-cl", bytes([3, 5]) +
    b"POST /v1/responses HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
put("h1", "chunked-ext-trailers", bytes([1, 6]) +
    b"POST /v1/messages HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
    b"5 ; a=\"q\\\"x\"\r\nhello\r\n0\r\nt: 1\r\n\r\n")

# --- sse: [max push, seed, limit] + the upstream stream --------------------------------------
def ev(t, obj):
    obj = dict(type=t, **obj)
    return f"event: {t}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n"

resp = {"id": "resp_1", "object": "response", "status": "in_progress", "model": "gpt-5.5", "output": []}
done = dict(resp, status="completed", usage={"input_tokens": 12, "input_tokens_details": {"cached_tokens": 4},
                                             "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 1},
                                             "total_tokens": 15})
item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": "hi", "annotations": []}]}
stream = (ev("response.created", {"response": resp}) + ev("response.in_progress", {"response": resp}) +
          ": keep-alive\n\n" +
          ev("codex.rate_limits", {"rate_limits": {"primary": {"used_percent": 12.5, "window_minutes": 300}}}) +
          ev("response.output_item.added", {"output_index": 0, "item": dict(item, status="in_progress", content=[])}) +
          ev("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "hi"}) +
          ev("response.output_item.done", {"output_index": 0, "item": item}) +
          ev("response.completed", {"response": done}))
put("sse", "codex-stream", bytes([0, 1, 255]) + stream.encode())
put("sse", "codex-stream-crlf", bytes([5, 2, 255]) + stream.replace("\n", "\r\n").encode())
put("sse", "data-only-done", bytes([1, 3, 255]) +
    b'data: {"type":"response.output_text.delta","delta":"a"}\r\rdata: line1\ndata: line2\n\ndata: [DONE]\n\n')
put("sse", "small-limit", bytes([9, 4, 8]) + stream[:400].encode())
put("sse", "failed", bytes([3, 5, 255]) + ev("response.failed", {"response": dict(resp, status="failed",
    error={"code": "server_error", "message": "boom"})}).encode() + b"event: error\ndata:{\"type\":\"error\"}\n\n")

# --- ws: [flags, max segment, seed] + frames --------------------------------------------------
def frame(opcode, payload, fin=True, rsv1=False, mask=None):
    b0 = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    n = len(payload)
    m = 0x80 if mask is not None else 0
    if n < 126:
        h = bytes([b0, m | n])
    elif n < 65536:
        h = bytes([b0, m | 126]) + struct.pack(">H", n)
    else:
        h = bytes([b0, m | 127]) + struct.pack(">Q", n)
    if mask is not None:
        h += bytes(mask)
        payload = bytes(p ^ mask[i % 4] for i, p in enumerate(payload))
    return h + payload

def deflate(data, c):
    out = c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)
    assert out.endswith(b"\x00\x00\xff\xff")
    return out[:-4]

K = [0x12, 0x34, 0x56, 0x78]
create = json.dumps({"type": "response.create", "model": "gpt-5.5", "store": False, "generate": False,
                     "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}).encode()
# server role (client frames are masked): text, ping, fragmented binary, close
put("ws", "client-frames", bytes([0, 0, 1]) + frame(1, create, mask=K) + frame(9, b"p", mask=K) +
    frame(2, b"ab", fin=False, mask=K) + frame(10, b"", mask=K) + frame(0, b"cd", mask=K) +
    frame(8, struct.pack(">H", 1000) + b"bye", mask=K))
c = zlib.compressobj(1, zlib.DEFLATED, -15)
put("ws", "client-deflate", bytes([2, 5, 2]) + frame(1, deflate(create, c), rsv1=True, mask=K) +
    frame(1, deflate(create, c), rsv1=True, mask=K))
c = zlib.compressobj(1, zlib.DEFLATED, -15)
whole = deflate(stream.encode(), c)
put("ws", "server-deflate-fragmented", bytes([3, 3, 3]) + frame(1, whole[:10], fin=False, rsv1=True) +
    frame(0, whole[10:]) + frame(9, b"ping"))
put("ws", "server-frames", bytes([1, 1, 4]) + frame(1, ev("response.completed", {"response": done}).encode()) +
    frame(2, bytes(range(256)) * 2) + frame(8, b""))
# generate mode: (kind, len, payload)*
put("ws", "generate", bytes([0x22, 4, 5]) + bytes([0, 20]) + b'{"type":"response.x"}'[:20] +
    bytes([1, 0x80 | 1, 0]) + b"z" * 256 + bytes([2, 3]) + b"abc" + bytes([4, 4]) + b"done")

# --- chat / anthropic / normalize: [flags] + the client's body --------------------------------
put("chat", "sdk-tools", bytes([0]) + json.dumps({
    "model": "gpt-5.5", "stream": True, "stream_options": {"include_usage": True},
    "messages": [{"role": "system", "content": "be brief"},
                 {"role": "user", "content": [{"type": "text", "text": "weather?"},
                                              {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]},
                 {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                   "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                 {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
    "tools": [{"type": "function", "function": {"name": "get_weather" + "_x" * 40, "description": "d",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "tool_choice": "auto", "reasoning_effort": "xhigh", "temperature": 0.2, "max_tokens": 50,
    "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object"}, "strict": True}},
}).encode())
put("chat", "minimal", bytes([7]) + b'{"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"},"prompt_cache_key":"k","user":"u"}')
put("anthropic", "sdk-tools", bytes([0]) + json.dumps({
    "model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": True,
    "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": "weather?"},
                 {"role": "assistant", "content": [{"type": "text", "text": "checking"},
                   {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                   {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}],
    "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto"}, "stop_sequences": ["END"], "temperature": 0.2,
}).encode())
put("anthropic", "thinking", bytes([15]) + b'{"model":"c","max_tokens":40000,"thinking":{"type":"enabled","budget_tokens":10000},"messages":[{"role":"user","content":"x"}],"output_config":{"effort":"high"}}')
put("normalize", "codex-cli", bytes([0]) + body)
put("normalize", "sdk", bytes([1]) + json.dumps({
    "model": "gpt-5.5", "input": "say hi", "instructions": "be brief", "temperature": 0.2,
    "max_output_tokens": 5, "store": True, "previous_response_id": "resp_1", "service_tier": "fast",
    "tools": [{"type": "web_search_preview"}], "reasoning": {"summary": "auto"},
    "input_extra": [{"role": "system", "content": "x"}]}).encode())
put("normalize", "system-role", bytes([2]) + b'{"model":"m","stream":true,"input":[{"type":"message","role":"system","content":"x"}],"type":"response.create","generate":false}')

# --- resp: replies from Redis -----------------------------------------------------------------
put("resp", "replies", b"+OK\r\n-ERR wrong type\r\n:42\r\n$5\r\nhello\r\n$-1\r\n*2\r\n$3\r\nfoo\r\n:-7\r\n*-1\r\n")
put("resp", "nested", b"*3\r\n*1\r\n+a\r\n$0\r\n\r\n*2\r\n:1\r\n$2\r\n\r\n\r\n")

# --- import: credential files -----------------------------------------------------------------
def jwt(payload):
    enc = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    return enc({"alg": "none", "typ": "JWT"}) + "." + enc(payload) + ".sig"

claims = {"email": "a@example.com", "exp": 1900000000,
          "https://api.openai.com/auth": {"chatgpt_account_id": "acc-1", "chatgpt_user_id": "user-1",
                                          "chatgpt_plan_type": "plus"}}
at, it = jwt(claims), jwt(dict(claims, aud="app"))
put("import", "auth-json", json.dumps({"auth_mode": "chatgpt", "OPENAI_API_KEY": None,
    "tokens": {"id_token": it, "access_token": at, "refresh_token": "rt_abcdefghijkl", "account_id": "acc-1"},
    "last_refresh": "2025-11-01T10:00:00.123456Z"}, indent=2))
put("import", "cpa-array", "\ufeff" + json.dumps([{"type": "codex", "id_token": it, "access_token": at,
    "refresh_token": "rt_cpa123456789", "account_id": "acc-2", "email": "b@example.com",
    "last_refresh": "2025-11-01T10:00:00Z", "expired": "2025-11-02T10:00:00+01:00"}, {"type": "claude", "access_token": "x"}, 5]))
put("import", "lines", "# tokens\nrt_line_token_123456\n\"" + at + "\"\n{\"refresh_token\":\"rt_json_line_1234\"}\n{bad json\n")

# --- encoding: [coding (top bit: round trip), limit/64] + body ---------------------------------
gz = zlib.compressobj(6, zlib.DEFLATED, 31)
put("encoding", "gzip", bytes([1, 255]) + gz.compress(body) + gz.flush())
put("encoding", "deflate", bytes([2, 255]) + zlib.compress(body))
put("encoding", "bomb", bytes([1, 2]) + (lambda c: c.compress(b"\0" * 100000) + c.flush())(zlib.compressobj(9, zlib.DEFLATED, 31)))
for i in range(8):
    put("encoding", f"round-trip-{i}", bytes([0x80 | i, 40]) + body[:2000])

# --- ws_ext: Sec-WebSocket-Extensions values, one per line -------------------------------------
put("ws_ext", "codex-offer", "permessage-deflate; client_max_window_bits")
put("ws_ext", "offers", 'x-webkit-deflate-frame, permessage-deflate; server_max_window_bits=10\n'
    'permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits="15"; client_max_window_bits=12')
