"""Measured fine-tuning peaks of diffusers' video transformers on fake tensors: the video DiT truth set.

Command (what ``tests/data/dit_truth.json`` comes from; no GPU, no downloads):

    .venv/bin/python benchmarks/dit_truth.py                          # every model, every setup
    .venv/bin/python benchmarks/dit_truth.py --only wan2.1-1.3b --out /tmp/wan13.json
    .venv/bin/python benchmarks/dit_truth.py --merge /tmp/a.json /tmp/b.json --out tests/data/dit_truth.json

Each point builds diffusers' own transformer class (``WanTransformer3DModel``, ...) from the
published ``transformer/config.json`` values below, at the real size, in bf16 with the class's
fp32 modules kept in fp32 (NOTE [ Modules kept in fp32 ] in ``tokenbucket.cost.dit_profile``),
under ``FakeTensorMode`` on ``cpu``, and runs two fine-tuning steps on cached latents and text
states (NOTE [ The fine-tuning step ]): the steady state, AdamW's states live. The peak of live
tensor bytes comes from PyTorch's ``MemTracker`` (unsharded) and ``FSDPMemTracker`` over FSDP2
``fully_shard`` (one unit per block, the root one more) on a fake process group of 8 ranks.
Attention runs as the CUDA kernels' meta functions say a GPU runs it.

The setups: ``full`` (every parameter trained), ``lora`` (rank 16 on ``to_q``, ``to_k``, ``to_v``,
``to_out.0``, as diffusers' training scripts add it), ``full`` under FSDP-8, and diffusers' own
gradient checkpointing (``enable_gradient_checkpointing()``) alone and under FSDP-8.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tokenbucket import DiTConfig, VAEFactors, profile_dit
from tokenbucket.models import dit_family

_WAN = {"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2], "attention_head_dim": 128,
        "in_channels": 16, "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "rope_max_seq_len": 1024}  # fmt: skip

_COG = {"_class_name": "CogVideoXTransformer3DModel", "activation_fn": "gelu-approximate", "attention_bias": True,
        "attention_head_dim": 64, "dropout": 0.0, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 16,
        "max_text_seq_length": 226, "norm_elementwise_affine": True, "norm_eps": 1e-5, "out_channels": 16,
        "patch_size": 2, "sample_frames": 49, "sample_height": 60, "sample_width": 90,
        "spatial_interpolation_scale": 1.875, "temporal_compression_ratio": 4, "temporal_interpolation_scale": 1.0,
        "text_embed_dim": 4096, "time_embed_dim": 512, "timestep_activation_fn": "silu"}  # fmt: skip
_LTX = {"_class_name": "LTXVideoTransformer3DModel", "activation_fn": "gelu-approximate", "attention_bias": True,
        "attention_out_bias": True, "caption_channels": 4096, "in_channels": 128, "out_channels": 128,
        "norm_elementwise_affine": False, "norm_eps": 1e-6, "num_attention_heads": 32, "patch_size": 1,
        "patch_size_t": 1, "qk_norm": "rms_norm_across_heads"}  # fmt: skip
_HUNYUAN = {"_class_name": "HunyuanVideoTransformer3DModel", "attention_head_dim": 128, "guidance_embeds": True,
            "in_channels": 16, "mlp_ratio": 4.0, "num_attention_heads": 24, "num_layers": 20,
            "num_refiner_layers": 2, "num_single_layers": 40, "out_channels": 16, "patch_size": 2, "patch_size_t": 1,
            "pooled_projection_dim": 768, "qk_norm": "rms_norm", "rope_axes_dim": [16, 56, 56], "rope_theta": 256.0,
            "text_embed_dim": 4096}  # fmt: skip
_COSMOS2 = {"_class_name": "CosmosTransformer3DModel", "adaln_lora_dim": 256, "attention_head_dim": 128,
            "concat_padding_mask": True, "extra_pos_embed_type": None, "in_channels": 17, "max_size": [128, 240, 240],
            "mlp_ratio": 4.0, "out_channels": 16, "patch_size": [1, 2, 2], "text_embed_dim": 1024}  # fmt: skip

# the published transformer configs (their transformer/config.json values) and VAE factors
PUBLISHED: dict[str, tuple[dict[str, Any], VAEFactors]] = {
    "wan2.1-1.3b": ({**_WAN, "num_attention_heads": 12, "ffn_dim": 8960, "num_layers": 30},
                    VAEFactors(4, 8, 16, "Wan2.1 VAE")),
    "wan2.1-14b": ({**_WAN, "num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40},
                   VAEFactors(4, 8, 16, "Wan2.1 VAE")),
    "wan2.2-ti2v-5b": ({**_WAN, "num_attention_heads": 24, "ffn_dim": 14336, "num_layers": 30,
                        "in_channels": 48, "out_channels": 48}, VAEFactors(4, 16, 48, "Wan2.2 VAE")),
    "cogvideox-2b": ({**_COG, "num_attention_heads": 30, "num_layers": 30}, VAEFactors(4, 8, 16, "CogVideoX VAE")),
    "cogvideox-5b": ({**_COG, "num_attention_heads": 48, "num_layers": 42, "use_rotary_positional_embeddings": True,
                      "use_learned_positional_embeddings": False}, VAEFactors(4, 8, 16, "CogVideoX VAE")),
    "cogvideox1.5-5b": ({**_COG, "num_attention_heads": 48, "num_layers": 42, "patch_bias": False, "patch_size_t": 2,
                         "sample_frames": 81, "sample_height": 300, "sample_width": 300,
                         "use_rotary_positional_embeddings": True, "use_learned_positional_embeddings": False},
                        VAEFactors(4, 8, 16, "CogVideoX VAE")),
    # LTX-Video 0.9.0 - 0.9.6 (2B) and 0.9.7 / 0.9.8 (13B)
    "ltx-video-2b": ({**_LTX, "attention_head_dim": 64, "cross_attention_dim": 2048, "num_layers": 28},
                     VAEFactors(8, 32, 128, "LTX-Video VAE")),
    "ltx-video-13b": ({**_LTX, "attention_head_dim": 128, "cross_attention_dim": 4096, "num_layers": 48},
                      VAEFactors(8, 32, 128, "LTX-Video VAE")),
    "hunyuan-video": (dict(_HUNYUAN), VAEFactors(4, 8, 16, "HunyuanVideo VAE")),
    "cosmos-predict2-2b": ({**_COSMOS2, "num_attention_heads": 16, "num_layers": 28, "rope_scale": [1.0, 3.0, 3.0]},
                           VAEFactors(4, 8, 16, "Wan2.1 VAE")),
    "cosmos-predict2-14b": ({**_COSMOS2, "num_attention_heads": 40, "num_layers": 36,
                             "rope_scale": [20 / 24, 2.0, 2.0]}, VAEFactors(4, 8, 16, "Wan2.1 VAE")),
}  # fmt: skip

# frames, height, width, text tokens: a short clip, the published size, and the long one
SHAPES: dict[str, list[tuple[int, int, int, int]]] = {
    "wan2.1-1.3b": [(17, 480, 832, 512), (33, 480, 832, 512), (81, 480, 832, 512)],
    "wan2.1-14b": [(17, 480, 832, 512), (49, 480, 832, 512), (81, 720, 1280, 512)],
    "wan2.2-ti2v-5b": [(33, 704, 1280, 512), (81, 704, 1280, 512), (121, 704, 1280, 512)],
    # CogVideoX: every prompt is 226 T5 states (max_text_seq_length); 1.0 at 480 x 720, 1.5 at 768 x 1360
    "cogvideox-2b": [(17, 480, 720, 226), (33, 480, 720, 226), (49, 480, 720, 226)],
    "cogvideox-5b": [(17, 480, 720, 226), (33, 480, 720, 226), (49, 480, 720, 226)],
    "cogvideox1.5-5b": [(49, 768, 1360, 226), (81, 768, 1360, 226), (161, 768, 1360, 226)],
    # LTX-Video: T5 prompts of 128 states; 512 x 768 (its 0.9 size) and 704 x 1280, up to 257 frames
    "ltx-video-2b": [(161, 512, 768, 128), (121, 704, 1280, 128), (257, 704, 1280, 128)],
    "ltx-video-13b": [(161, 512, 768, 128), (121, 704, 1280, 128), (257, 704, 1280, 128)],
    # HunyuanVideo: Llama prompts of 256 states; 544 x 960 and 720 x 1280, up to 129 frames
    "hunyuan-video": [(33, 544, 960, 256), (129, 544, 960, 256), (129, 720, 1280, 256)],
    # Cosmos-Predict2: T5 prompts of 512 states; 93 frames at 704 x 1280, and 480p
    "cosmos-predict2-2b": [(29, 704, 1280, 512), (93, 480, 832, 512), (93, 704, 1280, 512)],
    "cosmos-predict2-14b": [(29, 704, 1280, 512), (93, 480, 832, 512), (93, 704, 1280, 512)],
}
# (train, checkpointing, sharding, world size)
SETUPS = [("full", False, "none", 1), ("lora", False, "none", 1), ("full", False, "fsdp", 8),
          ("full", True, "none", 1), ("full", True, "fsdp", 8)]  # fmt: skip


def config(arch: str) -> DiTConfig:
    transformer, vae = PUBLISHED[arch]
    return DiTConfig(arch, str(transformer["_class_name"]), dict(transformer), vae)


def measure(arch: str, shape: tuple[int, int, int, int], setup: tuple[str, bool, str, int]) -> dict[str, Any]:
    frames, height, width, text = shape
    train, ckpt, sharding, world = setup
    cfg = config(arch)
    run = profile_dit(cfg, batch=1, frames=frames, height=height, width=width, text_tokens=text, train=train,
                      checkpointing=ckpt, sharding=sharding, world_size=world, steps=2)  # fmt: skip
    return {
        "arch": arch, "class_name": cfg.class_name, "frames": frames, "height": height, "width": width,
        "text_tokens": text, "batch": 1, "train": train, "checkpointing": ckpt, "sharding": sharding,
        "world_size": world, "steps": 2, "tokens": run.tokens, "peak_bytes": run.peak_bytes,
        "peak_breakdown": run.breakdown, "params_total": run.params_total,
        "params_trainable": run.params_trainable, "seconds": run.seconds, "versions": run.versions,
    }  # fmt: skip


def table(points: list[dict[str, Any]]) -> str:
    """Per model and setup: the measured peaks' range and the cost model's error range (Markdown)."""
    from tokenbucket import DiTCostModel, DiTSetup

    rows: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for p in points:
        setup = DiTSetup(train=p["train"], checkpointing=p["checkpointing"], sharding=p["sharding"],
                         world_size=p["world_size"])  # fmt: skip
        est = DiTCostModel(config(p["arch"]), setup).sample_memory(
            p["batch"], frames=p["frames"], height=p["height"], width=p["width"], text_tokens=p["text_tokens"]
        )
        name = p["train"] + (" + ckpt" if p["checkpointing"] else "") + (" FSDP-8" if p["sharding"] == "fsdp" else "")
        err = 100.0 * (est.peak_bytes - p["peak_bytes"]) / p["peak_bytes"]
        rows.setdefault((p["arch"], name), []).append((p["peak_bytes"] / 2**30, err))
    out = ["| model | setup | shapes | measured GiB | cost model vs measured |", "|---|---|---:|---|---|"]
    for (arch, name), vals in rows.items():
        gib, errs = [v[0] for v in vals], [v[1] for v in vals]
        out.append(f"| {arch} | {name} | {len(vals)} | {min(gib):,.1f} .. {max(gib):,.1f} | "
                   f"{min(errs):+.1f} .. {max(errs):+.1f} % |")  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(PUBLISHED))
    parser.add_argument("--out", type=Path, default=Path("tests/data/dit_truth.json"))
    parser.add_argument("--merge", nargs="+", type=Path)
    parser.add_argument("--table", action="store_true", help="print the fixture's points beside the cost model")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(args.out.read_text())["points"]))
        return 0
    configs = {
        arch: {"transformer": t, "vae": [v.temporal, v.spatial, v.channels]} for arch, (t, v) in PUBLISHED.items()
    }

    def write(points: list[dict[str, Any]]) -> None:  # after every point: a long run keeps what it measured
        args.out.write_text(json.dumps({"configs": configs, "points": points}, indent=1, sort_keys=True) + "\n")

    if args.merge:
        points = [p for path in args.merge for p in json.loads(path.read_text())["points"]]
        write(points)
    else:
        points = []
        for arch in args.only or sorted(PUBLISHED):
            dit_family(PUBLISHED[arch][0]["_class_name"])  # a class tokenbucket reads
            for shape in SHAPES[arch]:
                for setup in SETUPS:
                    started = time.perf_counter()
                    point = measure(arch, shape, setup)
                    points.append(point)
                    write(points)
                    print(f"{arch} {shape} {setup}: {point['peak_bytes'] / 2**30:.2f} GiB "
                          f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    print(f"{len(points)} points -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
