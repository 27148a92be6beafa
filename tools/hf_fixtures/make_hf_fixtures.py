#!/usr/bin/env python3
"""Writes the HF fixtures of worker/checkpoint/hf_convert_test.cc.

Builds tiny random MixtralForCausalLM and Qwen3MoeForCausalLM models in fp32 (fixed seeds), saves
them with save_pretrained (safetensors) to <out>/mixtral and <out>/qwen3_moe, and next to each a
reference.safetensors with "input_ids" (int32 [2, 16]) and "logits" (fp32 [2, 16, V]) from the
eager fp32 forward on the CPU, plus versions.json.

    python3 make_hf_fixtures.py --out worker/checkpoint/testdata/hf

Needs torch, transformers and safetensors. Everything runs on the CPU in fp32 (no TF32), so the
reference logits are plain fp32 results. Total size is about 1.5 MB (checked < 5 MB).
"""
import argparse
import json
import os
import platform
import sys

import safetensors
import torch
import transformers
from safetensors.torch import load_file, save_file

SEED = 1234
BATCH, SEQ = 2, 16
VOCAB = 256
INIT_STD = 0.1  # large enough that routing is far from uniform


def common_kwargs():
    return dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        num_experts_per_tok=2,
        initializer_range=INIT_STD,
        router_aux_loss_coef=0.01,
        output_router_logits=False,
        use_cache=False,
    )


def mixtral_model():
    cfg = transformers.MixtralConfig(
        **common_kwargs(),
        intermediate_size=32,  # expert FFN size
        num_local_experts=8,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        sliding_window=None,
        tie_word_embeddings=False,
        router_jitter_noise=0.0,
    )
    return transformers.MixtralForCausalLM, cfg, 10000.0


def qwen3_moe_model():
    cfg = transformers.Qwen3MoeConfig(
        **common_kwargs(),
        intermediate_size=96,  # the dense layer (mlp_only_layers)
        moe_intermediate_size=32,
        num_experts=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        rope_scaling=None,
        attention_bias=False,
        use_sliding_window=False,
        tie_word_embeddings=True,
    )
    return transformers.Qwen3MoeForCausalLM, cfg, 1e6


def rope_theta_of(cfg):
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:  # transformers 5 keeps it in rope_parameters
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
    return theta


def build(cls, cfg):
    try:
        model = cls._from_config(cfg, attn_implementation="eager")
    except TypeError:
        cfg._attn_implementation = "eager"
        model = cls(cfg)
    model = model.to(device="cpu", dtype=torch.float32)
    model.eval()
    # Re-initialise every parameter from one seeded generator: matrices (and fused 3-D expert
    # tensors) ~ N(0, INIT_STD^2), norm weights ~ 1 + N(0, INIT_STD^2) so that they matter too.
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied parameters appear once
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32) * INIT_STD
            p.copy_(noise + 1.0 if p.dim() == 1 else noise)
    return model


def forward_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float().contiguous()


def save_model(model, path):
    try:
        model.save_pretrained(path, safe_serialization=True)
    except TypeError:  # newer transformers: safetensors is the only format
        model.save_pretrained(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory (gets mixtral/ and qwen3_moe/)")
    args = ap.parse_args()

    torch.manual_seed(SEED)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(1)  # deterministic summation order on the CPU

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
    }
    print("versions:", json.dumps(versions))

    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(SEED + 1))
    total = 0
    for name, make in (("mixtral", mixtral_model), ("qwen3_moe", qwen3_moe_model)):
        cls, cfg, theta = make()
        got_theta = rope_theta_of(cfg)
        assert got_theta is not None and abs(float(got_theta) - theta) < 1e-9, (name, got_theta)
        model = build(cls, cfg)
        logits = forward_logits(model, ids)
        assert logits.shape == (BATCH, SEQ, VOCAB), logits.shape

        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        save_model(model, d)
        save_file(
            {"input_ids": ids.to(torch.int32).contiguous(), "logits": logits},
            os.path.join(d, "reference.safetensors"),
        )
        with open(os.path.join(d, "versions.json"), "w") as f:
            json.dump(versions, f, indent=2)
            f.write("\n")

        # Sanity: the saved checkpoint reloads to the same logits.
        try:
            again = cls.from_pretrained(d, attn_implementation="eager", torch_dtype=torch.float32)
        except TypeError:
            again = cls.from_pretrained(d)
        again = again.to(torch.float32).eval()
        diff = (forward_logits(again, ids) - logits).abs().max().item()
        assert diff == 0.0, f"{name}: reloaded model differs by {diff}"

        # Describe what was written (the C++ importer supports per-expert and fused experts).
        files = sorted(os.listdir(d))
        weights = {}
        for f in files:
            if f.endswith(".safetensors") and f != "reference.safetensors":
                weights.update(load_file(os.path.join(d, f)))
        fused = any(k.endswith("experts.gate_up_proj") for k in weights)
        print(f"{name}: {len(weights)} tensors, experts {'fused 3-D' if fused else 'per-expert'}, "
              f"max|logit| {logits.abs().max().item():.4f}")
        for k in sorted(weights)[:6]:
            print(f"  {k} {list(weights[k].shape)} {weights[k].dtype}")
        for f in files:
            size = os.path.getsize(os.path.join(d, f))
            total += size
            print(f"  {os.path.join(d, f)}: {size} bytes")
    print(f"total: {total} bytes")
    if total >= 5 * 1024 * 1024:
        sys.exit(f"fixtures are {total} bytes, over the 5 MB budget")


if __name__ == "__main__":
    main()
