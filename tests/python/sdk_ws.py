"""Drives the official OpenAI Python SDK's Responses WebSocket (`responses.connect()`)
through codex-gateway: two turns on one socket (the second by previous_response_id), then an
unknown previous_response_id. The `websockets` client offers permessage-deflate, so frames are
compressed both ways.

Usage: sdk_ws.py BASE_URL API_KEY   (BASE_URL like http://127.0.0.1:PORT/v1)
"""
import sys

from openai import OpenAI

from sdk_common import check


def one_turn(conn, event):
    conn.send(event)
    events = []
    for ev in conn:
        events.append(ev)
        if ev.type in ("response.completed", "response.failed", "error"):
            break
    return events


def main():
    base_url, key = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=30)
    # The SDK's default (no compression), then with permessage-deflate offered by websockets.
    for compression in (None, "deflate"):
        session(client, compression)
    print("ok")


def session(client, compression):
    opts = {"compression": compression}
    with client.responses.connect(max_retries=0, websocket_connection_options=opts) as conn:
        ws = getattr(conn, "_connection", None)
        exts = [type(e).__name__ for e in getattr(getattr(ws, "protocol", None), "extensions", [])]
        deflate = any("Deflate" in e for e in exts)
        check(deflate == (compression == "deflate"), f"extensions {exts} for {compression}")
        first = one_turn(conn, {"type": "response.create", "model": "gpt-5.5",
                                "input": "first " + "long input " * 4000})
        types = [e.type for e in first]
        check(types[0] == "response.created", f"first event {types[:3]}")
        check(types[-1] == "response.completed", f"first terminal {types[-3:]}")
        check("response.output_text.delta" in types, "deltas")
        text = "".join(e.delta for e in first if e.type == "response.output_text.delta")
        check(text.startswith("Hello from mock-codex"), f"text {text!r}")
        rid = first[-1].response.id

        second = one_turn(conn, {"type": "response.create", "model": "gpt-5.5",
                                 "previous_response_id": rid, "input": "second"})
        check(second[-1].type == "response.completed", f"second terminal {second[-1].type}")
        check(second[-1].response.id != rid, "a new response id")

        bad = one_turn(conn, {"type": "response.create", "model": "gpt-5.5",
                              "previous_response_id": "resp_unknown", "input": "x"})
        check(bad[-1].type == "error", f"unknown id gives an error event: {bad[-1]}")
        code = getattr(bad[-1].error, "code", None)
        check(code == "previous_response_not_found", f"code {code!r}")

        # The socket still serves after the error.
        third = one_turn(conn, {"type": "response.create", "model": "gpt-5.5", "input": "third"})
        check(third[-1].type == "response.completed", "third turn")


if __name__ == "__main__":
    main()
