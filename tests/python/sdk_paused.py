"""A streamed answer whose events come more than the gateway's quiet period (1 s) apart,
read by the official OpenAI Python SDK: between two events the gateway gives back the
stream's buffers, and every event must still arrive whole and in order.

Usage: sdk_paused.py BASE_URL API_KEY   (BASE_URL like http://127.0.0.1:PORT/v1)
The test sets the mock's account behaviour (two "tok " deltas, 1.2 s apart).
Exits non-zero with a message on the first failed expectation.
"""
import sys
import time

from openai import OpenAI

from sdk_common import check


def main():
    base_url, key = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)

    # The raw events of create(stream=True), with the time each arrived.
    events = []
    t0 = time.monotonic()
    with client.responses.create(model="gpt-5.5", input="pause", stream=True) as stream:
        for ev in stream:
            events.append((time.monotonic() - t0, ev))
    types = [ev.type for _, ev in events]
    check(types[0] == "response.created", f"first event {types[:1]}")
    check(types[-1] == "response.completed", f"last event {types[-1:]}")
    deltas = [(t, ev.delta) for t, ev in events if ev.type == "response.output_text.delta"]
    check([d for _, d in deltas] == ["tok ", "tok "], f"deltas {deltas!r}")
    # The pauses happened (the gateway did not buffer the answer into one write).
    check(deltas[1][0] - deltas[0][0] >= 1.0, f"deltas {deltas[1][0] - deltas[0][0]:.2f} s apart")
    done = [ev for _, ev in events if ev.type == "response.output_text.done"]
    check(len(done) == 1 and done[0].text == "tok tok ", f"output_text.done {done!r}")
    final = events[-1][1].response
    check(final.status == "completed", f"final status {final.status}")
    check(final.output_text == "tok tok ", f"final output_text {final.output_text!r}")
    seqs = [ev.sequence_number for _, ev in events]
    check(seqs == sorted(seqs) and len(set(seqs)) == len(seqs), f"sequence numbers {seqs}")

    # The responses.stream helper over the same pauses.
    with client.responses.stream(model="gpt-5.5", input="pause again") as stream:
        text = "".join(ev.delta for ev in stream if ev.type == "response.output_text.delta")
        final = stream.get_final_response()
    check(text == "tok tok " and final.output_text == text, f"helper {text!r} / {final.output_text!r}")

    print("ok: streams with pauses past the quiet period arrive whole")


if __name__ == "__main__":
    main()
