"""Gloo process groups for the distributed tests' spawned workers: a free port, and a group that
every rank ends cleanly before its process exits (NOTE [ Process group teardown ]).

    def _worker(rank: int, world: int, port: int) -> None:
        with gloo_group(rank, world, port):
            ...  # collectives

    spawn(_worker, args=(2, free_port()), nprocs=2)

A worker whose group someone else made (the HF ``Trainer``, through Accelerate) calls
:func:`end_process_group` as its last line instead.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["end_process_group", "free_port", "gloo_group", "spawn"]

# NOTE [ Ranks from a fork server ]
# mp.spawn starts each rank as a new interpreter that imports torch, numpy, pyarrow and the test
# module before its first line: two to four seconds a rank, some sixty ranks a suite, on two
# cores. A fork server imports them once, in a process that has run nothing else (no threads, no
# process group, no OpenMP pool), and forks each rank from it: the ranks are still separate
# processes with their own gloo group, started in a fraction of a second. The server is the pytest
# process's own (one per xdist worker), started at its first spawn and reused by every later one;
# a test module it did not preload is imported by each rank as before. A child of the fork server
# inherits "forkserver" as its start method, so a rank's DataLoader workers would each come from a
# server of the rank's own that imports torch anew (3 s a loader); a rank sets "fork" back first,
# Linux's default and what a rank that torchrun starts has. The server's environment and working
# folder are those of the test that started it, so each rank takes the spawning test's own, as
# mp.spawn's ranks do.
PRELOAD = ["numpy", "pyarrow", "pyarrow.parquet", "torch", "torch.distributed", "tokenbucket", "tests._dist"]


def spawn(fn: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """``mp.spawn(fn, args, nprocs, join=True)`` with the ranks forked from a fork server
    (NOTE [ Ranks from a fork server ]): ``fn(rank, *args)`` in each, errors raised as mp.spawn
    raises them."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*PRELOAD, fn.__module__])  # heeded when the server starts: the first call
    where = (dict(os.environ), os.getcwd())
    mp.start_processes(_rank, args=(fn, args, where), nprocs=nprocs, join=True, start_method="forkserver")


def _rank(rank: int, fn: Callable[..., None], args: tuple[Any, ...], where: tuple[dict[str, str], str]) -> None:
    multiprocessing.set_start_method("fork", force=True)  # NOTE [ Ranks from a fork server ]
    environ, cwd = where
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    fn(rank, *args)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# NOTE [ Process group teardown ]
# A spawned worker that returns with its gloo group alive exits with the group's worker threads
# still running. Each of them drops its last reference to a finished collective (and to the
# tensors it held) only after the rank waiting on it has woken up, so that drop can come after
# the rank's main thread has returned and begun shutting the interpreter down. A tensor made in
# Python needs the GIL to be freed; a C++ thread that asks for the GIL while the interpreter is
# finalizing is ended by CPython with pthread_exit, whose unwinding through torch's noexcept
# destructors calls std::terminate: "terminate called without an active exception", SIGABRT,
# and mp.spawn reports the rank as killed. It is a race of microseconds that only a busy machine
# loses. destroy_process_group() shuts the group's threads down (and waits for them) while the
# interpreter is whole; the barrier before it has every rank finish its collectives first, so
# no rank closes its connections while a peer still talks to it. On an error neither is done:
# the other ranks may be inside a collective that will never finish, and a barrier or a
# shutdown would hang where mp.spawn should see the error and end them.
def end_process_group() -> None:
    """Wait for every rank, then destroy the default group (NOTE [ Process group teardown ])."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int) -> Iterator[None]:
    """A gloo group of ``world`` ranks on 127.0.0.1:``port``, ended cleanly where the block ends
    without an error (NOTE [ Process group teardown ])."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    yield
    end_process_group()
