"""One short script for a machine with a CUDA GPU: a video DiT's cost model against the GPU's own peak.

    python benchmarks/gpu_check_dit.py            # prints a Markdown table

Wan 2.1 T2V 1.3B (diffusers' ``WanTransformer3DModel`` at its published config, random weights:
no download) fine-tuned as the scripts do (bf16 with the class's fp32 modules kept in fp32, the
flow-matching loss in fp32, ``AdamW(foreach=True)``) for two steps on the GPU at a few shapes and
setups; for each it prints ``DiTCostModel``'s prediction, the fake-tensor measurement on the CPU
(``profile_dit``) and ``torch.cuda.max_memory_allocated`` over the second step, with the ratios.
It exits with status 2, printing why, when no CUDA device is present. About a minute on an H100.
"""

from __future__ import annotations

import sys
import time

import torch

from tokenbucket import DiTConfig, DiTCostModel, DiTSetup, VAEFactors
from tokenbucket.models import dit_family

WAN_13B = {"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2], "num_attention_heads": 12,
           "attention_head_dim": 128, "in_channels": 16, "out_channels": 16, "text_dim": 4096, "freq_dim": 256,
           "ffn_dim": 8960, "num_layers": 30, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads",
           "eps": 1e-6}  # fmt: skip
CFG = DiTConfig("wan2.1-1.3b", "WanTransformer3DModel", WAN_13B, VAEFactors(4, 8, 16, "Wan2.1 VAE"))
POINTS = [  # frames, height, width, train, checkpointing
    (17, 480, 832, "full", False),
    (33, 480, 832, "full", False),
    (33, 480, 832, "lora", False),
    (81, 480, 832, "full", True),
]


def cuda_peak(frames: int, height: int, width: int, train: str, checkpointing: bool) -> int:
    """``max_memory_allocated`` over the second of two fine-tuning steps on the GPU."""
    import diffusers
    import peft

    torch.cuda.empty_cache()
    model = diffusers.WanTransformer3DModel.from_config({k: v for k, v in WAN_13B.items() if k[0] != "_"})
    model = model.to("cuda", torch.bfloat16)
    keep = tuple(model._keep_in_fp32_modules or ())
    for name, module in model.named_modules():  # NOTE [ Modules kept in fp32 ] in tokenbucket.cost.dit_profile
        if any(k in name for k in keep):
            module.to(torch.float32)
    if checkpointing:
        model.enable_gradient_checkpointing()
    if train == "lora":
        model.requires_grad_(False)
        model.add_adapter(peft.LoraConfig(r=16, lora_alpha=16, init_lora_weights="gaussian",
                                          target_modules=["to_q", "to_k", "to_v", "to_out.0"]))  # fmt: skip
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, foreach=True)
    fam = dit_family(CFG.class_name)
    with torch.device("cuda"):
        inputs = fam.inputs(CFG, 1, fam.latents(CFG, frames, height, width), 512, torch.bfloat16)
    target = inputs.pop("target")
    for step in range(2):
        if step:
            torch.cuda.reset_peak_memory_stats()
        pred = model(**inputs, return_dict=False)[0]
        loss = ((pred.float() - target.float()) ** 2).mean()
        del pred
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    peak = torch.cuda.max_memory_allocated()
    del model, opt, inputs, target, loss
    return peak


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU", file=sys.stderr)
        return 2
    from tokenbucket import profile_dit

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| frames | size | train | ckpt | tokens | analytic GiB | fake GiB | CUDA GiB | analytic/CUDA | fake/CUDA |")
    print("| ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    start = time.perf_counter()
    for frames, height, width, train, ckpt in POINTS:
        cost = DiTCostModel(CFG, DiTSetup(train=train, checkpointing=ckpt))
        est = cost.sample_memory(1, frames=frames, height=height, width=width, text_tokens=512)
        fake = profile_dit(CFG, batch=1, frames=frames, height=height, width=width, text_tokens=512, train=train,
                           checkpointing=ckpt).peak_bytes  # fmt: skip
        try:
            real = cuda_peak(frames, height, width, train, ckpt)
        except torch.OutOfMemoryError:
            print(f"| {frames} | {height}x{width} | {train} | {ckpt} | {est.video_tokens:,} | "
                  f"{est.peak_bytes / 2**30:.2f} | {fake / 2**30:.2f} | OOM | | |")  # fmt: skip
            continue
        print(f"| {frames} | {height}x{width} | {train} | {ckpt} | {est.video_tokens:,} | "
              f"{est.peak_bytes / 2**30:.2f} | {fake / 2**30:.2f} | {real / 2**30:.2f} | "
              f"{est.peak_bytes / real:.3f} | {fake / real:.3f} |", flush=True)  # fmt: skip
    print(f"\n{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
