"""Drives the official Anthropic Python SDK through codex-gateway's /v1/messages.

Usage: sdk_messages.py BASE_URL API_KEY
(BASE_URL is the gateway's root: the SDK adds /v1/messages itself.)
The test makes mock-codex answer the FIRST two requests with a get_weather call
(create, then the stream helper); the follow-up with the tool result gets text.
"""
import sys

import anthropic
from anthropic import Anthropic

from sdk_common import check


MODEL = "claude-sonnet-4-5-20250929"
TOOLS = [{"name": "get_weather", "description": "Weather of a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}]


def main():
    base_url, key = sys.argv[1], sys.argv[2]
    c = Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=30)
    ask = [{"role": "user", "content": "Weather in Paris?"}]

    # Tool call (non-streaming): a tool_use block with the parsed input.
    r = c.messages.create(model=MODEL, max_tokens=512, tools=TOOLS, messages=ask)
    check(r.stop_reason == "tool_use", f"stop_reason {r.stop_reason!r}")
    tool = [b for b in r.content if b.type == "tool_use"]
    check(len(tool) == 1 and tool[0].name == "get_weather", f"tool_use {r.content!r}")
    check(tool[0].input == {"city": "Paris"}, f"input {tool[0].input!r}")

    # The same call through the stream helper: the SDK assembles input_json_delta pieces.
    with c.messages.stream(model=MODEL, max_tokens=512, tools=TOOLS, messages=ask) as s:
        for _ in s:
            pass
        final = s.get_final_message()
    check(final.stop_reason == "tool_use", f"streamed tool stop_reason {final.stop_reason!r}")
    ftool = [b for b in final.content if b.type == "tool_use"]
    check(len(ftool) == 1 and ftool[0].input == {"city": "Paris"}, f"streamed tool {final.content!r}")

    # The tool result goes back (the SDK's own content blocks as the assistant turn).
    follow = ask + [{"role": "assistant", "content": r.content},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool[0].id,
                                                  "content": "sunny"}]}]
    r2 = c.messages.create(model=MODEL, max_tokens=512, tools=TOOLS, messages=follow)
    check(r2.stop_reason == "end_turn", f"follow-up stop_reason {r2.stop_reason!r}")
    check(r2.content[0].text.startswith("Hello from mock-codex"), f"follow-up {r2.content!r}")

    # Plain create.
    msgs = [{"role": "user", "content": "say hi"}]
    r = c.messages.create(model=MODEL, max_tokens=256, system="be brief", messages=msgs)
    check(r.type == "message" and r.role == "assistant", f"message {r!r}")
    check(r.content[0].type == "text" and r.content[0].text.startswith("Hello from mock-codex"),
          f"text {r.content!r}")
    check(r.stop_reason == "end_turn", f"stop_reason {r.stop_reason!r}")
    check(r.usage.input_tokens > 0 and r.usage.output_tokens > 0, f"usage {r.usage!r}")
    check(r.model == MODEL, f"model {r.model!r}")

    # stream=True: raw events in Anthropic's order.
    events = list(c.messages.create(model=MODEL, max_tokens=256, messages=msgs, stream=True))
    types = [e.type for e in events]
    check(types[0] == "message_start" and types[1] == "content_block_start", f"order {types}")
    check(types[-3:] == ["content_block_stop", "message_delta", "message_stop"], f"end {types}")
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    check(text.startswith("Hello from mock-codex"), f"streamed {text!r}")
    check(events[-2].delta.stop_reason == "end_turn", "message_delta stop_reason")
    check(events[-2].usage.output_tokens > 0, "message_delta usage")

    # The messages.stream() helper.
    with c.messages.stream(model=MODEL, max_tokens=256, messages=msgs) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    check(streamed.startswith("Hello from mock-codex"), f"text_stream {streamed!r}")
    check(final.content[0].text == streamed, "final message text")
    check(final.stop_reason == "end_turn", "final stop_reason")
    check(final.usage.output_tokens > 0 and final.usage.input_tokens > 0, f"final usage {final.usage!r}")

    # Stop sequences.
    r = c.messages.create(model=MODEL, max_tokens=64, messages=msgs, stop_sequences=["mock"])
    check(r.content[0].text == "Hello from ", f"cut text {r.content[0].text!r}")
    check(r.stop_reason == "stop_sequence" and r.stop_sequence == "mock", "stop_sequence")

    # count_tokens.
    n = c.messages.count_tokens(model=MODEL, messages=msgs, system="be brief")
    check(n.input_tokens > 0, f"count_tokens {n!r}")

    # Errors come back as the SDK's typed exceptions.
    bad = Anthropic(base_url=base_url, api_key="sk-wrong", max_retries=0, timeout=30)
    try:
        bad.messages.create(model=MODEL, max_tokens=16, messages=msgs)
        check(False, "a wrong key must fail")
    except anthropic.AuthenticationError as e:
        check(e.status_code == 401 and e.body["error"]["type"] == "authentication_error", f"{e.body!r}")
    try:
        c.messages.create(model=MODEL, max_tokens=16, messages=msgs,
                          tools=[{"type": "bash_20250124", "name": "bash"}])
        check(False, "an Anthropic-defined tool must be refused")
    except anthropic.BadRequestError as e:
        check(e.status_code == 400 and e.body["error"]["type"] == "invalid_request_error", f"{e.body!r}")
    print("ok: messages create/stream/helper/tools/stop/count_tokens/errors")


if __name__ == "__main__":
    main()
