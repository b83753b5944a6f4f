"""A pytest plugin that records which outside oracles each test reaches (the census of issue 52).

An oracle here is code no one in this project wrote that a test holds tokenbucket to: a
`transformers` model, image or video processor or tokenizer, a trainer or launcher (Lightning,
Accelerate, the HF `Trainer`, PEFT), a data library (datasets, torchdata, webdataset, Ray Data),
a `torch.distributed` process group by backend, and torch's memory trackers. The plugin wraps
the constructors of those classes as their modules are imported (nothing is imported early, so
the tests' own import checks see what they always saw) and writes, at the end of the session,
``{test id: [oracle, ...]}`` as JSON.

    TOKENBUCKET_ORACLES=/tmp/oracles.json .venv/bin/python -m pytest -p tests._oracles -q

Under xdist each worker writes its own file (the path with ``.gwN`` added). What a test runs
in a subprocess (the examples, the CLI) is not seen here; ``benchmarks/test_census.py`` adds
the static names the test files import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import pytest

# module -> (class name, label): the label names the oracle's kind; the class recorded is the
# instance's own type, so a subclass (Qwen2VLForConditionalGeneration) is named, not its base
_HOOKS: dict[str, list[tuple[str, str]]] = {
    "transformers.modeling_utils": [("PreTrainedModel", "model")],
    "transformers.image_processing_utils": [("BaseImageProcessor", "image processor")],
    "transformers.video_processing_utils": [("BaseVideoProcessor", "video processor")],
    "transformers.processing_utils": [("ProcessorMixin", "processor")],
    "transformers.tokenization_utils_base": [("PreTrainedTokenizerBase", "tokenizer")],
    "transformers.trainer": [("Trainer", "framework")],
    "accelerate.accelerator": [("Accelerator", "framework")],
    "lightning.pytorch.trainer.trainer": [("Trainer", "framework")],
    "lightning.fabric.fabric": [("Fabric", "framework")],
    "peft.peft_model": [("PeftModel", "framework")],
    "torchdata.stateful_dataloader.stateful_dataloader": [("StatefulDataLoader", "data")],
    "datasets.arrow_dataset": [("Dataset", "data")],
    "ray.data.dataset": [("Dataset", "data")],
    "webdataset.compat": [("WebDataset", "data")],
    "torch.distributed._tools.mem_tracker": [("MemTracker", "memory tracker")],
    "torch.distributed._tools.fsdp2_mem_tracker": [("FSDPMemTracker", "memory tracker")],
}

_current: list[str] = [""]
_seen: dict[str, set[str]] = defaultdict(set)


def _note(label: str, obj: object) -> None:
    cls = type(obj)
    _seen[_current[0]].add(f"{label}: {cls.__module__.split('.')[0]}.{cls.__name__}")


def _wrap(module: ModuleType, name: str, label: str) -> None:
    cls = getattr(module, name, None)
    if not isinstance(cls, type) or getattr(cls.__init__, "_census", False):
        return
    original = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _note(label, self)
        original(self, *args, **kwargs)

    __init__._census = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]


def _init_process_group(original: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        backend = kwargs.get("backend", args[0] if args else None)
        _seen[_current[0]].add(f"process group: {backend}")
        return original(*args, **kwargs)

    return wrapped


class _Patch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Patches a watched module right after it runs, by wrapping its real loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                inner = spec.loader
                exec_module = inner.exec_module

                def patched(module: ModuleType, _exec: Callable[[ModuleType], None] = exec_module) -> None:
                    _exec(module)
                    for name, label in _HOOKS[fullname]:
                        _wrap(module, name, label)

                inner.exec_module = patched  # type: ignore[method-assign]
                return spec
        return None


def pytest_configure(config: pytest.Config) -> None:
    for fullname, hooks in _HOOKS.items():  # already imported: patch now
        if fullname in sys.modules:
            for name, label in hooks:
                _wrap(sys.modules[fullname], name, label)
    sys.meta_path.insert(0, _Patch())
    import torch.distributed as dist

    dist.init_process_group = _init_process_group(dist.init_process_group)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    _current[0] = item.nodeid
    _seen.setdefault(item.nodeid, set())
    try:
        return (yield)
    finally:
        _current[0] = ""


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("TOKENBUCKET_ORACLES")
    if not path:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        path = f"{path}.{worker}"
    with open(path, "w") as f:
        json.dump({k: sorted(v) for k, v in sorted(_seen.items()) if k}, f, indent=0)
