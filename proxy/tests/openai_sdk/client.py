"""Drives the proxy with the official OpenAI Python SDK: stream, non-stream, completions, errors.

Usage: python3 client.py BASE_URL  (e.g. http://127.0.0.1:4140/v1). Exits non-zero on any failure.
"""

import sys

import openai

base_url = sys.argv[1]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)

models = [m.id for m in client.models.list().data]
assert models == ["glm-5.3", "qwen-3.6-27b", "default"], models

chat = client.chat.completions.create(
    model="glm-5.3",
    messages=[{"role": "user", "content": "Hi! What is 2+2?"}],
    max_tokens=4,
)
assert chat.model in ("glm-5.3", "qwen-3.6-27b"), chat.model
assert chat.usage.completion_tokens == 4, chat.usage
assert chat.choices[0].message.content, chat

stream = client.chat.completions.create(
    model="default",
    messages=[{"role": "user", "content": "Hi! What is 2+2?"}],
    max_tokens=5,
    stream=True,
    stream_options={"include_usage": True},
)
pieces, usage = [], None
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        pieces.append(chunk.choices[0].delta.content)
    if chunk.usage is not None:
        usage = chunk.usage
assert pieces, "streamed content"
assert usage is not None and usage.completion_tokens == 5, usage

completion = client.completions.create(model="qwen-3.6-27b", prompt="Say hi", max_tokens=3)
assert completion.model == "qwen-3.6-27b", completion.model
assert completion.usage.completion_tokens == 3, completion.usage

try:
    client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    raise AssertionError("an unknown model must fail")
except openai.NotFoundError as e:
    assert e.status_code == 404 and e.code == "model_not_found", e

try:
    client.chat.completions.create(model="glm-5.3", messages=[])
    raise AssertionError("empty messages must fail")
except openai.BadRequestError as e:
    assert e.status_code == 400, e

print("openai sdk: ok")
