"""The largest batch of each LeRobot VLA policy on one H100, for 1 to 3 cameras.

python examples/plan_lerobot_policy.py

pi0, pi0.5 and SmolVLA at LeRobot 0.4.4's published defaults, each in the training setups
LeRobot's flags give (``freeze_vision_encoder``, ``train_expert_only``): what one steady-state
AdamW step keeps at its peak (:meth:`LeRobotPolicy.memory`, checked against LeRobot's own
policies in tests/data/lerobot_truth.json) under the GPU's budget (``gpu_budget_bytes``: the card
less the CUDA context, the allocator's workspace and a safety margin). A camera here is a slot
the policy runs; for a LeRobot mixture's batch size per bucket see plan_lerobot_mixture_policy.py.
"""

from __future__ import annotations

from tokenbucket import LeRobotPolicy, get_gpu, gpu_budget_bytes

GPU = "H100-SXM"
# (policy, setup, LeRobot flags): SmolVLA's published default trains the expert only
SETUPS = [
    ("pi0", "full", {}),
    ("pi0", "frozen tower", {"freeze_vision_encoder": True}),
    ("pi0", "expert only", {"train_expert_only": True}),
    ("pi05", "full", {}),
    ("pi05", "frozen tower", {"freeze_vision_encoder": True}),
    ("pi05", "expert only", {"train_expert_only": True}),
    ("smolvla", "expert only (default)", {}),
    ("smolvla", "VLM trained", {"train_expert_only": False}),
    ("smolvla", "full", {"train_expert_only": False, "freeze_vision_encoder": False}),
]


def main() -> None:
    budget = gpu_budget_bytes(get_gpu(GPU))
    print(
        f"largest batch per step on one {GPU} ({budget / 2**30:.1f} GiB budget); the language padded as LeRobot "
        "pads it (pi0, SmolVLA: 48 tokens; pi0.5: 200)"
    )
    print(f"{'policy':<8} {'setup':<22} {'1 camera':>9} {'2 cameras':>10} {'3 cameras':>10}")
    for name, setup, flags in SETUPS:
        policy = LeRobotPolicy.preset(name, **flags)
        text = policy.tokenizer_max_length
        batches = [policy.max_batch(budget, cameras=c, text_tokens=text) for c in (1, 2, 3)]
        print(f"{name:<8} {setup:<22} {batches[0]:>9} {batches[1]:>10} {batches[2]:>10}")


if __name__ == "__main__":
    main()
