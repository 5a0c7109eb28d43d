"""Drives the official OpenAI Python SDK through codex-gateway with production-sized requests.

Usage: sdk_large.py BASE_URL API_KEY

Requests (each tagged so the Rust test can find it upstream and check it arrived whole):
  RESP-JSON / RESP-SSE  responses.create with a ~200 KB conversation (201 messages)
  TOOL-JSON / TOOL-SSE  responses.create with a ~100 KB function_call_output
  CHAT-JSON / CHAT-SSE  chat.completions.create with a ~200 KB message list (201 messages)
Every message text is "[TAG:NNNN] <600 chars> <TAG:NNNN>" and the last one ends with
" END-TAG"; a tool output is lines "NNNNN: <80 chars>" and then "END-TAG". The filler has JSON
escapes and multi-byte UTF-8, so a split read inside a character or an escape shows up.
Exits non-zero with a message on the first failed expectation.
"""
import sys

from openai import OpenAI

from sdk_common import check

MODEL = "gpt-5.5"
N_MESSAGES = 201
MESSAGE_CHARS = 600
TOOL_OUTPUT_CHARS = 100_000
ANSWER = "Hello from mock-codex"


def filler(seed, n):
    """Deterministic text of exactly n characters with quotes, backslashes, newlines, UTF-8."""
    out = ""
    i = seed
    while len(out) < n:
        out += f'w{i % 997} "q" \\ é漢字🙂\n '
        i += 7
    return out[:n]


def message_text(tag, i):
    return f"[{tag}:{i:04d}] {filler(i, MESSAGE_CHARS)} <{tag}:{i:04d}>"


def conversation(tag):
    msgs = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": message_text(tag, i)}
        for i in range(N_MESSAGES)
    ]
    msgs[-1]["content"] += f" END-{tag}"
    return msgs


def tool_input(tag):
    lines = []
    size = 0
    i = 0
    while size < TOOL_OUTPUT_CHARS:
        line = f"{i:05d}: " + filler(i, 80).replace("\n", "|")
        lines.append(line)
        size += len(line) + 1
        i += 1
    output = "\n".join(lines) + f"\nEND-{tag}"
    return [
        {"role": "user", "content": f"[{tag}] read the big file"},
        {"type": "function_call", "call_id": "call_big_1", "name": "read_file",
         "arguments": '{"path":"big.txt"}'},
        {"type": "function_call_output", "call_id": "call_big_1", "output": output},
    ]


TOOLS = [{"type": "function", "name": "read_file", "description": "read a file",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                         "required": ["path"]}}]


def responses_json(client, tag, input, **kw):
    r = client.responses.create(model=MODEL, input=input, instructions="be brief", **kw)
    check(r.status == "completed", f"{tag}: status {r.status}")
    check(r.output_text.startswith(ANSWER), f"{tag}: output_text {r.output_text!r}")
    check(r.usage is not None and r.usage.input_tokens > 0, f"{tag}: usage")


def responses_sse(client, tag, input, **kw):
    types, text = [], ""
    with client.responses.create(model=MODEL, input=input, stream=True, **kw) as stream:
        for ev in stream:
            types.append(ev.type)
            if ev.type == "response.output_text.delta":
                text += ev.delta
    check(types[:1] == ["response.created"], f"{tag}: first event {types[:1]}")
    check(types[-1:] == ["response.completed"], f"{tag}: last event {types[-1:]}")
    check(text.startswith(ANSWER), f"{tag}: streamed text {text!r}")


def main():
    base_url, key = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)

    responses_json(client, "RESP-JSON", conversation("RESP-JSON"))
    responses_sse(client, "RESP-SSE", conversation("RESP-SSE"))
    responses_json(client, "TOOL-JSON", tool_input("TOOL-JSON"), tools=TOOLS)
    responses_sse(client, "TOOL-SSE", tool_input("TOOL-SSE"), tools=TOOLS)

    msgs = [{"role": "system", "content": "be brief"}] + conversation("CHAT-JSON")
    r = client.chat.completions.create(model=MODEL, messages=msgs)
    content = r.choices[0].message.content or ""
    check(content.startswith(ANSWER), f"CHAT-JSON: content {content!r}")
    check(r.choices[0].finish_reason == "stop", "CHAT-JSON: finish_reason")
    check(r.usage is not None and r.usage.prompt_tokens > 0, "CHAT-JSON: usage")

    msgs = [{"role": "system", "content": "be brief"}] + conversation("CHAT-SSE")
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    check(text.startswith(ANSWER), f"CHAT-SSE: streamed {text!r}")
    check(chunks[-1].usage is not None, "CHAT-SSE: usage chunk")

    print("ok: ~200 KB conversations and ~100 KB tool outputs (responses JSON/SSE), "
          "~200 KB chat message lists (JSON/SSE)")


if __name__ == "__main__":
    main()
