#!/usr/bin/env bash
# Builds the truth generator's own environment in benchmarks/lerobot_truth/.venv (git-ignored).
#
#   bash benchmarks/lerobot_truth/build.sh           # ~2 min; no model weights are downloaded
#   benchmarks/lerobot_truth/.venv/bin/python benchmarks/lerobot_truth/measure.py
#
# torch comes from the PyTorch CPU index (TORCH_INDEX; set it empty where that index is out of
# reach and a local wheel directory holds the CPU build, as on this project's machines:
# TORCH_INDEX= bash benchmarks/lerobot_truth/build.sh). Everything else is installed with
# --no-deps from requirements.txt, the whole environment pinned, and a constraints file keeps pip
# from replacing the CPU torch.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="$HERE/.venv"
TORCH_INDEX="${TORCH_INDEX-https://download.pytorch.org/whl/cpu}"

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
TORCH_PIN="$(grep -E '^torch==' "$HERE/requirements.txt")"
CONSTRAINTS="$VENV/constraints.txt"
echo "$TORCH_PIN" > "$CONSTRAINTS"

INDEX_ARGS=()
if [ -n "$TORCH_INDEX" ]; then INDEX_ARGS=(--extra-index-url "$TORCH_INDEX"); fi
"${PIP[@]}" install -q "${INDEX_ARGS[@]}" "$TORCH_PIN"
# requirements.txt is the whole environment, pinned: nothing to resolve (see its header)
"${PIP[@]}" install -q --no-deps -c "$CONSTRAINTS" -r "$HERE/requirements.txt"
# SmolVLA's transformers beside the pi fork, in a folder of its own (see requirements-smolvla.txt)
"${PIP[@]}" install -q --no-deps --upgrade --target "$VENV/smolvla-site" -r "$HERE/requirements-smolvla.txt"
"$VENV/bin/python" -c 'import lerobot, torch, transformers; print("lerobot", lerobot.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'
