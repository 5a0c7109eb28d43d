"""Drives the official OpenAI Python SDK through codex-gateway (Responses API).

Usage: sdk_responses.py BASE_URL API_KEY   (BASE_URL like http://127.0.0.1:PORT/v1)
Exits non-zero with a message on the first failed expectation.
"""
import sys

from openai import OpenAI

from sdk_common import check


def main():
    base_url, key = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=30)

    # 1. non-streaming create
    r = client.responses.create(model="gpt-5.5", input="say hi", instructions="be brief")
    check(r.status == "completed", f"status {r.status}")
    check(r.output_text.startswith("Hello from mock-codex"), f"output_text {r.output_text!r}")
    check(r.usage is not None and r.usage.total_tokens > 0, "usage")

    # 1b. a continuation by previous_response_id (the gateway replays the kept transcript),
    # and an unknown id: 400 previous_response_not_found
    r2 = client.responses.create(model="gpt-5.5", input="and again", previous_response_id=r.id)
    check(r2.status == "completed" and r2.id != r.id, f"continuation {r2.status}")
    try:
        client.responses.create(model="gpt-5.5", input="x", previous_response_id="resp_unknown")
        check(False, "an unknown previous_response_id must fail")
    except Exception as e:  # openai.BadRequestError
        check(getattr(e, "status_code", None) == 400, f"unknown id: {e!r}")
        check(getattr(e, "code", None) == "previous_response_not_found", f"code of {e!r}")

    # 2. create(stream=True): iterate raw events
    types = []
    text = ""
    with client.responses.create(model="gpt-5.5", input="say hi", stream=True) as stream:
        for ev in stream:
            types.append(ev.type)
            if ev.type == "response.output_text.delta":
                text += ev.delta
    check(types[0] == "response.created", f"first event {types[:1]}")
    check(types[-1] == "response.completed", f"last event {types[-1:]}")
    check(text.startswith("Hello from mock-codex"), f"streamed text {text!r}")

    # 3. the responses.stream helper (needs output_item.added + content_part.added first)
    deltas = []
    with client.responses.stream(model="gpt-5.5", input="say hi") as stream:
        for ev in stream:
            if ev.type == "response.output_text.delta":
                deltas.append(ev.delta)
        final = stream.get_final_response()
    check("".join(deltas) == final.output_text, "helper text matches final response")
    check(final.output_text.startswith("Hello from mock-codex"), f"helper final {final.output_text!r}")

    # 4. errors surface as SDK exceptions with the OpenAI shape
    bad = OpenAI(base_url=base_url, api_key="sk-cg-wrong", max_retries=0)
    try:
        bad.responses.create(model="gpt-5.5", input="x")
        check(False, "wrong key must fail")
    except Exception as e:  # openai.AuthenticationError
        check(getattr(e, "status_code", None) == 401, f"wrong key gave {e!r}")

    print("ok: responses.create, create(stream=True), responses.stream, auth error")


if __name__ == "__main__":
    main()
