"""Checks a simulated vLLM replica with the official OpenAI Python SDK and prometheus_client.

Why: the simulator claims to speak what vLLM speaks; the strictest readers of that claim are the
clients people actually use. Run by `tests/server/binary.rs` against the real `vllm-sim` binary:

    python3 openai_sdk_check.py http://127.0.0.1:PORT MODEL

Exits 0 and prints OK when every check passes; raises (non-zero exit) otherwise.
"""

import sys
import urllib.request

import openai
from prometheus_client.parser import text_string_to_metric_families

EXPECTED_FAMILIES = {
    # prometheus_client strips `_total` from counter family names.
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:cache_config_info",
    "vllm:lora_requests_info",
}


def main() -> None:
    base, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=30, max_retries=0)

    whole = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=5,
    )
    assert whole.object == "chat.completion", whole
    assert whole.choices[0].message.role == "assistant", whole
    assert whole.choices[0].message.content, whole
    assert whole.choices[0].finish_reason == "length", whole
    assert whole.usage.completion_tokens == 5, whole.usage
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 5, whole.usage

    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Stream something."}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 4, chunks
    assert content[-1].choices[0].finish_reason == "length", content[-1]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4, chunks[-1]
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 0, chunks[-1]

    try:
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}]
        )
        raise AssertionError("an unknown model must fail")
    except openai.NotFoundError as e:
        assert e.status_code == 404, e

    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    vllm = {n for n in families if n.startswith("vllm:") and not n.endswith("_created")}
    assert vllm == EXPECTED_FAMILIES, sorted(vllm ^ EXPECTED_FAMILIES)
    assert families["vllm:prompt_tokens"].type == "counter"
    assert families["vllm:time_to_first_token_seconds"].type == "histogram"
    generated = [s for s in families["vllm:generation_tokens"].samples if s.name.endswith("_total")]
    assert generated[0].value == 9.0, generated
    assert generated[0].labels == {"model_name": model, "engine": "0"}, generated
    print("OK")


if __name__ == "__main__":
    main()
