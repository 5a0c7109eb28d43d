"""Drives the official Anthropic Python SDK with extended thinking through codex-gateway.

Usage: sdk_thinking_switch.py BASE_URL API_KEY first
       sdk_thinking_switch.py BASE_URL API_KEY second < first's stdout
`first` asks with thinking on and prints the answer's content blocks (JSON), a thinking block
with its signature first. `second` sends that content back as the assistant turn (as Claude
clients do) and asks again: the test switched the pool's account in between, so this proves
a conversation carrying our thinking signature continues on another account.
"""
import json
import sys

from anthropic import Anthropic

from sdk_common import check


MODEL = "claude-sonnet-4-5-20250929"
THINKING = {"type": "enabled", "budget_tokens": 10000}


def main():
    base_url, key, phase = sys.argv[1], sys.argv[2], sys.argv[3]
    c = Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=30)
    ask = {"role": "user", "content": "Think, then answer."}
    if phase == "first":
        r = c.messages.create(model=MODEL, max_tokens=16000, thinking=THINKING, messages=[ask])
        blocks = [b.model_dump(exclude_none=True) for b in r.content]
        check(blocks and blocks[0]["type"] == "thinking", f"a thinking block first: {blocks!r}")
        check(blocks[0].get("signature"), "the thinking block is signed")
        print(json.dumps(blocks))
        return
    content = json.load(sys.stdin)
    r = c.messages.create(
        model=MODEL,
        max_tokens=16000,
        thinking=THINKING,
        messages=[ask, {"role": "assistant", "content": content},
                  {"role": "user", "content": "And again."}],
    )
    text = "".join(b.text for b in r.content if b.type == "text")
    check(text, f"an answer after the switch: {r.content!r}")
    print(json.dumps({"text": text}))


if __name__ == "__main__":
    main()
