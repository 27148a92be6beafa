"""PyTorch reference for bench/train_benchmark.cc: the same benchmark model and the same training
step, in plain PyTorch on one GPU, timed the same way (median wall time of whole optimizer steps
after warm-up, synchronised at the end of each step).

Model (mirrors train_benchmark.cc's BENCHMARK MODEL; --model small is its ~100 M version):
  Qwen3-MoE-like: token embedding, per layer RMSNorm -> attention (q/k/v/o Linear, no bias; GQA;
  per-head RMSNorm of q and k; RoPE base 1e6, rotate_half; F.scaled_dot_product_attention with
  is_causal=True, flash backend when available) -> residual -> RMSNorm -> MoE (fp32 router, softmax
  top-k renormalised, Switch/GShard aux loss with coefficient 1e-3, SwiGLU experts through
  torch._grouped_mm / F.grouped_mm, as bench/torch_moe_baseline.py; a per-expert loop when neither
  exists) -> residual; final RMSNorm; untied LM head; F.cross_entropy.

Mixed precision: the standard PyTorch recipe: fp32 parameters (these are the master weights) and
fp32 gradients, forward under torch.autocast(dtype=torch.bfloat16). The expert weights are cast to
bf16 explicitly in forward (autocast does not cover grouped_mm), the router runs in fp32 (as
Megatron's moe_router_dtype fp32 and as Switchyard). Optimizer: torch.optim.AdamW(fused=True),
lr 1e-4 constant, betas (0.9, 0.999), eps 1e-8, weight decay 0.01 on the rank >= 2 weights and 0 on
the norm weights (Megatron's groups); clip_grad_norm_(1.0). Gradient accumulation over the
micro-batches, each micro-batch's loss scaled by its share of the global batch (CE: sum over the
micro-batch / tokens of the global batch; aux: 1 / number of micro-batches), like the trainer.

FLOPs per token: flops_per_token() implements model::GptTrainingFlopsPerToken exactly
(Megatron-style, causal attention counted half, fwd + bwd = 3 x fwd). MFU against --peak_tflops
(989.4, BASELINES.md).

  python3 torch_train_baseline.py [--model benchmark|small] [--steps 5] [--warmup 2]
      [--micro_batch N] [--global_batch N] [--seq_length N] [--layers N] [--json OUT]

Writes JSON {step_ms_median, step_ms, tokens_per_s, tflops, mfu, peak_mem_gb, torch_version,
device, ...}; on an out-of-memory or any other failure the JSON carries "error" instead of the
timings, so the C++ benchmark still prints its own table.
"""
import argparse
import json
import math
import sys
import time
import traceback

MODELS = {
    # The BENCHMARK MODEL (~1.5 B total / ~0.35 B active parameters).
    "benchmark": dict(layers=12, hidden=1536, heads=12, head_dim=128, groups=4, vocab=32768,
                      experts=64, topk=8, moe_ffn=384, seq=4096, micro=2, glob=16),
    # ~100 M version for a quick run.
    "small": dict(layers=4, hidden=768, heads=6, head_dim=128, groups=2, vocab=32768,
                  experts=32, topk=4, moe_ffn=192, seq=1024, micro=2, glob=8),
}
NORM_EPS = 1e-6
ROPE_BASE = 1e6
AUX_COEFF = 1e-3
INIT_STD = 0.02
LR, WEIGHT_DECAY, CLIP = 1e-4, 0.01, 1.0


def flops_per_token(c):
    """model::GptTrainingFlopsPerToken (worker/model/gpt_model.cc), all layers MoE, no shared
    expert."""
    h, d, hq, hkv = c["hidden"], c["head_dim"], c["heads"], c["groups"]
    per_layer_attn = 2 * h * (hq * d + 2 * hkv * d) + 2 * hq * d * h  # q, k, v, o
    attn_core = 2.0 * 2.0 * hq * d * (c["seq"] / 2.0)  # q.k and p.v, causal
    total = 0.0
    for _ in range(c["layers"]):
        total += per_layer_attn + attn_core
        total += 2 * h * c["experts"]  # router
        total += 2.0 * c["topk"] * 3 * h * c["moe_ffn"]  # routed experts
    total += 2 * h * c["vocab"]  # LM head
    return 3 * total


def build(c, torch, nn, F):
    dev = "cuda"
    gm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
    try:  # native GQA in SDPA (torch >= 2.5), used only when the flash backend takes it
        from torch.nn.attention import SDPBackend, sdpa_kernel
        t = torch.zeros(1, 2, 8, 64, device=dev, dtype=torch.bfloat16)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(t, t[:, :1], t[:, :1], is_causal=True, enable_gqa=True)
        gqa = True
    except Exception:
        gqa = False

    def rms_norm(dim):
        if hasattr(nn, "RMSNorm"):
            class RMSNorm(nn.RMSNorm):  # fp32 math and weight, output in the input's dtype
                def forward(self, x):
                    return super().forward(x.float()).to(x.dtype)
            return RMSNorm(dim, eps=NORM_EPS)

        class RMSNorm(nn.Module):  # torch < 2.4
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.ones(dim))

            def forward(self, x):
                xf = x.float()
                y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + NORM_EPS)
                return (y * self.weight).to(x.dtype)
        return RMSNorm()

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            h, d = c["hidden"], c["head_dim"]
            self.hq, self.hkv, self.d = c["heads"], c["groups"], d
            self.q = nn.Linear(h, self.hq * d, bias=False)
            self.k = nn.Linear(h, self.hkv * d, bias=False)
            self.v = nn.Linear(h, self.hkv * d, bias=False)
            self.o = nn.Linear(self.hq * d, h, bias=False)
            self.q_norm = rms_norm(d)
            self.k_norm = rms_norm(d)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            q = self.q_norm(self.q(x).view(b, s, self.hq, self.d)).transpose(1, 2)
            k = self.k_norm(self.k(x).view(b, s, self.hkv, self.d)).transpose(1, 2)
            v = self.v(x).view(b, s, self.hkv, self.d).transpose(1, 2)
            q = (q * cos + rotate_half(q) * sin).to(torch.bfloat16)
            k = (k * cos + rotate_half(k) * sin).to(torch.bfloat16)
            v = v.to(torch.bfloat16)
            if self.hkv != self.hq and gqa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                return self.o(y.transpose(1, 2).reshape(b, s, self.hq * self.d))
            if self.hkv != self.hq:  # torch < 2.5: expand k/v
                rep = self.hq // self.hkv
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o(y.transpose(1, 2).reshape(b, s, self.hq * self.d))

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            h, f, E = c["hidden"], c["moe_ffn"], c["experts"]
            self.k, self.E = c["topk"], E
            self.router = nn.Parameter(torch.randn(E, h) * INIT_STD)
            self.w13 = nn.Parameter(torch.randn(E, h, 2 * f) * INIT_STD)
            self.w2 = nn.Parameter(torch.randn(E, f, h) * (INIT_STD / math.sqrt(2 * c["layers"])))

        def forward(self, x):
            shape = x.shape
            x = x.reshape(-1, shape[-1]).to(torch.bfloat16)
            T = x.shape[0]
            with torch.autocast("cuda", enabled=False):
                logits = x.float() @ self.router.t()
                scores = torch.softmax(logits, -1)
            probs, idx = torch.topk(scores, self.k, dim=-1)
            probs = probs / probs.sum(-1, keepdim=True)
            flat = idx.reshape(-1)
            order = torch.argsort(flat, stable=True)
            counts = torch.bincount(flat, minlength=self.E)
            src = order // self.k
            xs = x[src]
            w13 = self.w13.to(torch.bfloat16)
            w2 = self.w2.to(torch.bfloat16)
            if gm is not None:
                offs = torch.cumsum(counts, 0).to(torch.int32)
                y = gm(xs, w13, offs=offs)
                g, u = y.chunk(2, dim=-1)
                y = gm(F.silu(g) * u, w2, offs=offs)
            else:  # per-expert loop (host sync on the counts)
                outs, start = [], 0
                for e, n in enumerate(counts.tolist()):
                    g, u = (xs[start:start + n] @ w13[e]).chunk(2, dim=-1)
                    outs.append((F.silu(g) * u) @ w2[e])
                    start += n
                y = torch.cat(outs, 0)
            y = y * probs.reshape(-1)[order].unsqueeze(-1).to(y.dtype)
            out = torch.zeros_like(x).index_add_(0, src, y)
            # Switch/GShard aux loss (Megatron aux_loss): E * sum_e f_e * P_e.
            aux = (counts.float() / (T * self.k) * scores.mean(0)).sum() * self.E * AUX_COEFF
            return out.view(shape), aux

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_norm = rms_norm(c["hidden"])
            self.attention = Attention()
            self.post_attention_norm = rms_norm(c["hidden"])
            self.moe = MoE()

        def forward(self, x, cos, sin):
            x = x + self.attention(self.input_norm(x), cos, sin)
            y, aux = self.moe(self.post_attention_norm(x))
            return x + y, aux

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(c["vocab"], c["hidden"])
            self.layers = nn.ModuleList([Layer() for _ in range(c["layers"])])
            self.final_norm = rms_norm(c["hidden"])
            self.output = nn.Linear(c["hidden"], c["vocab"], bias=False)
            d = c["head_dim"]
            inv = 1.0 / (ROPE_BASE ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
            ang = torch.outer(torch.arange(c["seq"], dtype=torch.float32), inv)
            ang = torch.cat((ang, ang), dim=-1)  # [S, D], rotate_half layout
            self.register_buffer("cos", ang.cos()[None, None], persistent=False)
            self.register_buffer("sin", ang.sin()[None, None], persistent=False)

        def forward(self, ids, targets, ce_scale):
            s = ids.shape[1]
            cos, sin = self.cos[:, :, :s], self.sin[:, :, :s]
            x = self.embedding(ids)
            aux_total = 0.0
            for layer in self.layers:
                x, aux = layer(x, cos, sin)
                aux_total = aux_total + aux
            logits = self.output(self.final_norm(x))
            ce = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1),
                                 reduction="sum")
            return ce, aux_total, ce * ce_scale

    with torch.device(dev):  # build on the GPU (no 6 GB host copy)
        model = Model()
    # Megatron init: N(0, std) for the weights (output projections scaled), norms 1.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                p.fill_(1.0)
            elif name.endswith("attention.o.weight"):
                p.normal_(0, INIT_STD / math.sqrt(2 * c["layers"]))
            elif not name.endswith(("moe.router", "moe.w13", "moe.w2")):
                p.normal_(0, INIT_STD)
    return model, ("grouped_mm" if gm is not None else "loop") + (", sdpa gqa" if gqa else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="benchmark", choices=sorted(MODELS))
    ap.add_argument("--steps", type=int, default=5, help="timed optimizer steps (median)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps")
    ap.add_argument("--micro_batch", type=int, default=0)
    ap.add_argument("--global_batch", type=int, default=0)
    ap.add_argument("--seq_length", type=int, default=0)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--peak_tflops", type=float, default=989.4)
    ap.add_argument("--json", default="", help="write the results as JSON to this path")
    a = ap.parse_args()

    c = dict(MODELS[a.model])
    if a.layers > 0: c["layers"] = a.layers
    if a.seq_length > 0: c["seq"] = a.seq_length
    if a.micro_batch > 0: c["micro"] = a.micro_batch
    if a.global_batch > 0: c["glob"] = a.global_batch
    num_micro = c["glob"] // c["micro"]
    tokens = c["glob"] * c["seq"]
    fpt = flops_per_token(c)
    result = dict(model=a.model, config=c, tokens_per_step=tokens, flops_per_token=fpt,
                  steps=a.steps, warmup=a.warmup,
                  precision="fp32 params/grads + torch.autocast(bfloat16); AdamW(fused=True)")

    def write():
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f)

    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except Exception as e:  # no torch on this machine
        result["error"] = f"import torch: {e}"
        print(result["error"], file=sys.stderr)
        write()
        return 1
    result["torch_version"] = torch.__version__
    if c["glob"] % c["micro"] != 0:
        result["error"] = "global_batch must be a multiple of micro_batch"
        write()
        return 2
    if not torch.cuda.is_available():
        result["error"] = "no CUDA device"
        print(result["error"], file=sys.stderr)
        write()
        return 0
    result["device"] = torch.cuda.get_device_name(0)
    print("torch", torch.__version__, result["device"], flush=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        torch.manual_seed(1234)
        model, experts_impl = build(c, torch, nn, F)
        result["experts_impl"] = experts_impl
        n_total = sum(p.numel() for p in model.parameters())
        n_routed = sum(p.numel() for n, p in model.named_parameters() if n.endswith(("w13", "w2")))
        result["params_total"] = n_total
        result["params_active"] = n_total - n_routed + n_routed // c["experts"] * c["topk"]
        print(f"model {a.model}: {c}; {n_total / 1e9:.3f} B params "
              f"({result['params_active'] / 1e9:.3f} B active); experts via {experts_impl}; "
              f"{num_micro} micro-batches x {c['micro']} x {c['seq']} = {tokens} tokens/step",
              flush=True)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        groups = [dict(params=decay, weight_decay=WEIGHT_DECAY),
                  dict(params=no_decay, weight_decay=0.0)]
        try:
            opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8, fused=True)
        except (TypeError, RuntimeError):
            opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8)
        gen = torch.Generator(device="cuda")
        gen.manual_seed(1234)
        ce_scale = 1.0 / tokens
        aux_scale = 1.0 / num_micro

        def step():
            opt.zero_grad(set_to_none=True)
            loss_sum = torch.zeros((), device="cuda")
            for _ in range(num_micro):
                seq = torch.randint(0, c["vocab"], (c["micro"], c["seq"] + 1), device="cuda",
                                    generator=gen)
                ids, targets = seq[:, :-1], seq[:, 1:]
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    ce, aux, scaled = model(ids, targets, ce_scale)
                (scaled + aux_scale * aux).backward()
                loss_sum += ce.detach()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            return (loss_sum / tokens).item(), norm.item()

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for i in range(a.warmup + a.steps):
            t0 = time.perf_counter()
            loss, norm = step()  # .item() synchronises
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            tflops = fpt * tokens / (ms / 1e3) / 1e12
            print(f"step {i + 1}/{a.warmup + a.steps} | loss {loss:.4f} | grad norm {norm:.3f} | "
                  f"{ms:.1f} ms | {tokens / (ms / 1e3):.0f} tok/s | {tflops:.1f} TFLOP/s | "
                  f"MFU {100 * tflops / a.peak_tflops:.1f}%"
                  + ("  (warm-up)" if i < a.warmup else ""), flush=True)
            if i >= a.warmup:
                times.append(ms)
        ts = sorted(times)
        n = len(ts)
        med = ts[n // 2] if n % 2 else 0.5 * (ts[n // 2 - 1] + ts[n // 2])
        tok_s = tokens / (med / 1e3)
        tflops = fpt * tok_s / 1e12
        result.update(step_ms_median=med, step_ms=times, tokens_per_s=tok_s, tflops=tflops,
                      mfu=tflops / a.peak_tflops if a.peak_tflops > 0 else -1,
                      final_loss=loss,
                      peak_mem_gb=torch.cuda.max_memory_allocated() / 2**30,  # allocated, not reserved
                      peak_mem_reserved_gb=torch.cuda.max_memory_reserved() / 2**30)
        print(f"median step {med:.1f} ms, {tok_s:.0f} tokens/s, {tflops:.1f} TFLOP/s, "
              f"MFU {100 * result['mfu']:.1f}%, peak memory {result['peak_mem_gb']:.1f} GiB",
              flush=True)
    except torch.cuda.OutOfMemoryError as e:
        result["error"] = f"out of memory: {str(e).splitlines()[0] if str(e) else 'OOM'}"
        try:
            result["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 2**30
        except Exception:
            pass
        print(result["error"], file=sys.stderr)
        write()
        return 1
    except Exception as e:
        traceback.print_exc()
        result["error"] = f"{type(e).__name__}: {e}"
        write()
        return 1
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
