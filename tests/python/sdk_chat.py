"""Drives the official OpenAI Python SDK's chat API and models.list through codex-gateway.

Usage: sdk_chat.py BASE_URL API_KEY
"""
import json
import sys

from openai import OpenAI
from pydantic import BaseModel

from sdk_common import check


class Answer(BaseModel):
    city: str
    population: int


def main():
    base_url, key = sys.argv[1], sys.argv[2]
    c = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=30)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say hi"}]

    # tool-call round trip: the test makes the mock answer the FIRST request with a function call
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    r = c.chat.completions.create(model="gpt-5.5", messages=msgs, tools=tools)
    msg = r.choices[0].message
    check(msg.tool_calls is not None and len(msg.tool_calls) == 1, f"tool call expected, got {msg!r}")
    check(msg.tool_calls[0].function.name == "get_weather", "tool name")
    check(json.loads(msg.tool_calls[0].function.arguments)["city"] == "Paris", "tool args")
    check(r.choices[0].finish_reason == "tool_calls", "finish tool_calls")
    follow = msgs + [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "sunny"}]
    r2 = c.chat.completions.create(model="gpt-5.5", messages=follow, tools=tools)
    check(r2.choices[0].message.content.startswith("Hello from mock-codex"), "follow-up answer")

    r = c.chat.completions.create(model="gpt-5.5", messages=msgs)
    check(r.choices[0].message.content.startswith("Hello from mock-codex"), f"content {r.choices[0].message.content!r}")
    check(r.choices[0].finish_reason == "stop", "finish_reason")
    check(r.usage.total_tokens > 0, "usage")

    chunks = list(c.chat.completions.create(model="gpt-5.5", messages=msgs, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    check(text.startswith("Hello from mock-codex"), f"streamed {text!r}")
    check(chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0, "usage chunk")

    with c.chat.completions.stream(model="gpt-5.5", messages=msgs) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    check(final.choices[0].message.content.startswith("Hello from mock-codex"), "stream helper")

    # structured output request shape is accepted
    r = c.chat.completions.create(model="gpt-5.5", messages=msgs, response_format={
        "type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": Answer.model_json_schema()}})
    check(r.choices[0].message.content is not None, "structured output answered")

    models = c.models.list()
    ids = [m.id for m in models.data]
    check("gpt-5.5" in ids, f"models.list {ids}")
    print("ok: chat create/stream/helper/tools/structured, models.list")


if __name__ == "__main__":
    main()
