#!/usr/bin/env python3
"""Scores token windows with Hugging Face transformers and compares with Switchyard's --eval.

    python3 hf_eval_check.py --hf DIR --tokens FILE --seq N [--ours LOSS] [--tol 1e-3]
                             [--device cuda]

DIR is an HF model directory (`switchyard-worker --export-hf`), FILE the windows
`switchyard-worker --eval --load DIR --eval_tokens_out FILE` scored (int32 little-endian
[samples, seq + 1]: inputs [:, :-1], targets [:, 1:]). The model runs in fp32 with the eager
attention and TF32 off, in eval mode (no router jitter, no aux loss); the loss is the mean
cross-entropy over every target token, computed from the logits in float64 (the same definition
as Switchyard's validation loss). With --ours, exits 1 when |ours - transformers| > tol.
Issue 18's rule: within 1e-3 on the GPU host in fp32.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--seq", type=int, required=True, help="the spec's model.seq_length")
    ap.add_argument("--ours", type=float)
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args()
    with open(os.path.join(a.hf, "config.json")) as f:
        config = json.load(f)
    raw = np.fromfile(a.tokens, dtype="<i4")
    width = a.seq + 1
    if raw.size == 0 or raw.size % width != 0:
        sys.exit("%s holds %d int32, not a whole number of windows of --seq + 1 = %d" % (
            a.tokens, raw.size, width))
    tokens = torch.from_numpy(raw.reshape(-1, width).astype(np.int64))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = transformers.AutoModelForCausalLM.from_pretrained(
        a.hf, torch_dtype=torch.float32, attn_implementation="eager").to(a.device).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, tokens.shape[0], a.batch):
            x = tokens[i:i + a.batch].to(a.device)
            logits = model(input_ids=x[:, :-1]).logits.double()
            lse = torch.logsumexp(logits, dim=-1)
            target = logits.gather(-1, x[:, 1:].unsqueeze(-1)).squeeze(-1)
            total += float((lse - target).sum())
            count += target.numel()
    loss = total / count
    print("transformers %s %s (%s, fp32, eager attention) on %s: %d windows x %d tokens, "
          "loss %.6f" % (transformers.__version__, config.get("architectures"), a.device,
                         a.tokens, tokens.shape[0], tokens.shape[1] - 1, loss))
    if a.ours is not None:
        diff = abs(a.ours - loss)
        ok = diff <= a.tol
        print("switchyard --eval %.6f vs transformers %.6f: |diff| %.3g (tolerance %g) %s" % (
            a.ours, loss, diff, a.tol, "OK" if ok else "FAIL"))
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
