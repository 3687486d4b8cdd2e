#!/usr/bin/env python3
"""The shape of prefill and decode cost on a real GPU, for the TTFT model's prefill term.

The routing core predicts a prefill of `u` new tokens after `c` cached ones as
`u / rate + pair_s * (u * c + u**2 / 2)` (docs/ttft-model.md, step 4), and the simulator's engine
charges the same form per step (integration/sim/src/cost.rs). This script checks that form on
hardware: it times the forward pass of transformer layers shaped like the benchmark's
`qwen-3.6-27b` profile (dense, 64 layers, hidden 5120, 64 query heads, 8 KV heads, head_dim 128,
SwiGLU MLP 21,504 wide: 27.2B parameters), with random BF16 weights (timing does not depend on
the values), over a grid of (new, cached) token counts, fits the three coefficients by least
squares and reports how well the form explains the times. It also times decode steps (one token
per sequence against its KV) at several batch sizes, for the per-step and per-sequence costs.

Only `LAYERS` layers are instantiated; every layer is identical, so the model's time is the
measured time x 64 / LAYERS (the per-layer time is what is measured, printed as such too).

    python3 scripts/gpu_prefill_shape.py --out DIR      # on a CUDA machine with PyTorch >= 2.5

Writes DIR/prefill_shape.json (every timing and the fits) and prints a summary. Not run in CI:
it needs a GPU, and the project's tests must not.
"""

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

HIDDEN = 5120
Q_HEADS = 64
KV_HEADS = 8
HEAD_DIM = 128
MLP = 21504
MODEL_LAYERS = 64
NOTES = []


class Layer(torch.nn.Module):
    """One pre-norm decoder layer: RMSNorm, GQA attention, RMSNorm, SwiGLU MLP."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(HIDDEN, (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.o = torch.nn.Linear(Q_HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.gate_up = torch.nn.Linear(HIDDEN, 2 * MLP, bias=False)
        self.down = torch.nn.Linear(MLP, HIDDEN, bias=False)
        self.n1 = torch.nn.RMSNorm(HIDDEN)
        self.n2 = torch.nn.RMSNorm(HIDDEN)

    def forward(self, x, k_buf, v_buf):
        # x: [batch, new, HIDDEN]; k_buf, v_buf: [batch, KV_HEADS, cached + new, HEAD_DIM], the
        # cached part filled. The new tokens' K and V are written in place, as vLLM writes them
        # into its paged blocks, and attention reads the whole buffer with grouped heads (no
        # copies of the cache).
        b, n, _ = x.shape
        h = self.n1(x)
        q, k, v = self.qkv(h).split(
            [Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1
        )
        q = q.view(b, n, Q_HEADS, HEAD_DIM).transpose(1, 2)
        total = k_buf.shape[2]
        k_buf[:, :, total - n:] = k.view(b, n, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v_buf[:, :, total - n:] = v.view(b, n, KV_HEADS, HEAD_DIM).transpose(1, 2)
        if n == 1:
            a = F.scaled_dot_product_attention(q, k_buf, v_buf, enable_gqa=True)
        else:
            # New tokens attend to every cached token and causally to each other: the causal
            # mask aligned to the bottom-right corner, which the fused kernels support.
            mask = causal_lower_right(n, total)
            try:
                a = F.scaled_dot_product_attention(q, k_buf, v_buf, attn_mask=mask, enable_gqa=True)
            except (TypeError, RuntimeError) as e:
                # An older PyTorch without grouped heads for this mask: expand them (a copy of
                # the cache per call, which inflates the cached tokens' cost; reported).
                if not NOTES:
                    NOTES.append(f"grouped-query attention with the causal mask failed ({e}); "
                                 "K/V expanded instead")
                rep = Q_HEADS // KV_HEADS
                a = F.scaled_dot_product_attention(
                    q, k_buf.repeat_interleave(rep, 1), v_buf.repeat_interleave(rep, 1),
                    attn_mask=mask)
        x = x + self.o(a.transpose(1, 2).reshape(b, n, Q_HEADS * HEAD_DIM))
        g, u = self.gate_up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


def timed(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    times.sort()
    return times[len(times) // 2]


def lstsq(rows, ys):
    """Least squares without numpy's help for tiny systems: returns coefficients, R², residuals."""
    x = torch.tensor(rows, dtype=torch.float64)
    y = torch.tensor(ys, dtype=torch.float64).unsqueeze(1)
    coef = torch.linalg.lstsq(x, y).solution
    fit = (x @ coef).squeeze(1)
    y = y.squeeze(1)
    ss_res = float(((y - fit) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    rel = [float(abs(f - t) / t) for f, t in zip(fit, y)]
    return [float(c) for c in coef.squeeze(1)], 1.0 - ss_res / ss_tot, rel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--new", default="256,512,1024,2048,4096,8192")
    ap.add_argument("--cached", default="0,2048,8192,16384,32768")
    ap.add_argument("--batches", default="1,8,32,64,128,256")
    ap.add_argument("--decode-context", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    torch.manual_seed(0)
    dev = torch.device("cuda")
    layers = torch.nn.ModuleList([Layer() for _ in range(args.layers)]).to(dev, torch.bfloat16)
    for p in layers.parameters():
        torch.nn.init.normal_(p, std=0.02)
    scale = MODEL_LAYERS / args.layers
    props = torch.cuda.get_device_properties(dev)
    params = sum(p.numel() for p in layers[0].parameters()) * MODEL_LAYERS
    print(f"{props.name}, torch {torch.__version__}; model {params / 1e9:.1f}B params "
          f"({args.layers} of {MODEL_LAYERS} layers instantiated)", flush=True)

    def run(x, caches):
        with torch.inference_mode():
            for layer, (kc, vc) in zip(layers, caches):
                x = layer(x, kc, vc)
        return x

    def buffers(batch, length):
        return [
            (
                torch.randn(batch, KV_HEADS, length, HEAD_DIM, device=dev, dtype=torch.bfloat16),
                torch.randn(batch, KV_HEADS, length, HEAD_DIM, device=dev, dtype=torch.bfloat16),
            )
            for _ in layers
        ]

    prefill = []
    for c in [int(v) for v in args.cached.split(",")]:
        for u in [int(v) for v in args.new.split(",")]:
            kv = buffers(1, c + u)
            x = torch.randn(1, u, HIDDEN, device=dev, dtype=torch.bfloat16)
            t = timed(lambda: run(x, kv), 2, args.reps) * scale
            prefill.append({"new": u, "cached": c, "seconds": t})
            print(f"prefill new={u:>5} cached={c:>5}: {t * 1000:8.1f} ms "
                  f"({u / t:8.0f} tokens/s)", flush=True)
            del kv
        torch.cuda.empty_cache()

    # t = a + u / rate + pair_s * (u*c + u²/2)
    rows = [[1.0, r["new"], r["new"] * r["cached"] + r["new"] ** 2 / 2] for r in prefill]
    (a, per_token, pair), r2, rel = lstsq(rows, [r["seconds"] for r in prefill])
    lin, r2_lin, rel_lin = lstsq([row[:2] for row in rows], [r["seconds"] for r in prefill])
    flops_token = 2 * params
    fit = {
        "overhead_s": a,
        "prefill_token_s": per_token,
        "prefill_tokens_per_second": 1.0 / per_token,
        "prefill_attention_pair_s": pair,
        "r2": r2,
        "max_rel_residual": max(rel),
        "mean_rel_residual": sum(rel) / len(rel),
        "linear_only": {"r2": r2_lin, "max_rel_residual": max(rel_lin),
                        "mean_rel_residual": sum(rel_lin) / len(rel_lin)},
        "mfu_linear_part": flops_token / per_token / 989e12,
    }
    print(json.dumps(fit, indent=1), flush=True)

    decode = []
    L = args.decode_context
    for b in [int(v) for v in args.batches.split(",")]:
        kv = buffers(b, L + 1)
        x = torch.randn(b, 1, HIDDEN, device=dev, dtype=torch.bfloat16)
        t = timed(lambda: run(x, kv), 3, args.reps) * scale
        decode.append({"batch": b, "context": L, "seconds": t})
        print(f"decode batch={b:>4} context={L}: {t * 1000:7.2f} ms per step", flush=True)
        del kv
        torch.cuda.empty_cache()
    (d0, per_seq), r2_dec, rel_dec = lstsq([[1.0, d["batch"]] for d in decode],
                                           [d["seconds"] for d in decode])
    dec_fit = {"step_s": d0, "per_seq_s": per_seq, "r2": r2_dec, "max_rel_residual": max(rel_dec)}
    print(json.dumps(dec_fit, indent=1), NOTES, flush=True)

    out = {
        "device": props.name,
        "torch": torch.__version__,
        "model": {"params": params, "layers": MODEL_LAYERS, "hidden": HIDDEN, "q_heads": Q_HEADS,
                  "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "mlp": MLP,
                  "instantiated_layers": args.layers},
        "prefill": prefill,
        "prefill_fit": fit,
        "decode": decode,
        "decode_fit": dec_fit,
        "notes": NOTES,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    import os
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "prefill_shape.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
