"""Characterising collective cells: AllReduce, AllGather and ReduceScatter over message size and group size,
measured through torch.distributed, one process per device (torch.multiprocessing.spawn).

`softsyn characterize --provider cuda --cells 'AllReduce*,AllGather*,ReduceScatter*' -o LIB.yaml` on a host
with several GPUs: for each group size of 2, 4, 8 ... up to the GPUs it has, one spawn of that many ranks
(backend nccl, one GPU each); per op and message size (the whole buffer S, as nccl-tests and
softsyn.library.collectives count it) warm-up calls, then timed calls between barriers, each rank's
wall clock after torch.cuda.synchronize, the slowest rank's per call, median. `--provider cpu` runs the
same recipe on gloo over CPU processes (how the recipe is tested; the figures describe nothing deployed).
The result is a collective library (kind: collectives) with one table per op over axes [ranks, bytes].
"""
from __future__ import annotations

import datetime
import os
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from softsyn.library.collectives import PRECISION
from softsyn.progress import log
from softsyn.errors import SoftsynError

SIZES = [2**k for k in range(10, 29, 2)]  # 1 KiB .. 256 MiB
QUICK_SIZES = [2**10, 2**14, 2**18]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, ops: list[str], sizes: list[int], runs: int, backend: str, out: str):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dtype = torch.float16 if backend == "nccl" else torch.float32  # gloo reduces no fp16
    sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
    table: dict[str, list[float]] = {}
    for op in ops:
        row = []
        for size in sizes:
            count = max(world, size // (2 if backend == "nccl" else 4) // world * world)
            full = torch.ones(count, dtype=dtype, device=device)
            part = torch.ones(count // world, dtype=dtype, device=device)
            call = {"AllReduce": lambda: dist.all_reduce(full),
                    "AllGather": lambda: dist.all_gather_into_tensor(full, part),
                    "ReduceScatter": lambda: dist.reduce_scatter_tensor(part, full)}[op]
            times = []
            for i in range(runs + 3):
                dist.barrier()
                sync()
                start = time.perf_counter()
                call()
                sync()
                if i >= 3:
                    times.append(time.perf_counter() - start)
            slowest = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            row.append(statistics.median(slowest.tolist()))
        table[op] = row
    if rank == 0:
        Path(out).write_text(yaml.safe_dump(table))
    dist.destroy_process_group()


def characterize_collectives(provider: str, output: str | os.PathLike, ops: list[str], quick: bool = False,
                             progress: bool = True, command: str = "", devices: int | None = None) -> Path:
    """Measure `ops` at every group size the host allows and write the collective library to `output`."""
    backend = "nccl" if provider == "cuda" else "gloo"
    available = torch.cuda.device_count() if provider == "cuda" else (devices or 2)
    if available < 2:
        raise SoftsynError(f"characterize --cells {','.join(ops)}: collectives need at least 2 devices; this host "
                           f"has {available} ({provider}); run it on a multi-GPU host")
    ranks = [n for n in (2, 4, 8, 16, 32, 64) if n <= available]
    sizes = QUICK_SIZES if quick else SIZES
    runs = 5 if quick else 20
    measured: dict[int, dict] = {}
    scratch = Path(output).with_suffix(".part.yaml")
    for world in ranks:
        if progress:
            log(f"collectives {', '.join(ops)} over {world} ranks ({backend}), {len(sizes)} sizes")
        mp.spawn(_rank, args=(world, _free_port(), ops, sizes, runs, backend, str(scratch)), nprocs=world, join=True)
        measured[world] = yaml.safe_load(scratch.read_text())
    scratch.unlink(missing_ok=True)
    device = torch.cuda.get_device_name() if provider == "cuda" else "CPU processes (gloo)"
    lib = {"library": Path(output).stem, "format": 1, "kind": "collectives",
           "runtime": f"torch.distributed {torch.__version__} (backend {backend})", "device": device,
           "date": datetime.date.today().isoformat(), "command": command,
           "status": f"measured: median over {runs} calls of the slowest rank's wall clock, barrier before each",
           "collectives": {},
           "cells": [{"op": op, "precision": PRECISION, "implementation": backend, "axes": ["ranks", "bytes"],
                      "points": [ranks, sizes], "delays": [measured[n][op] for n in ranks]} for op in ops]}
    if len(ranks) == 1:  # a one-point axis cannot interpolate: the table holds its one group size
        lib["status"] += f"; one group size ({ranks[0]} ranks)"
    path = Path(output)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(lib, sort_keys=False))
    tmp.replace(path)
    return path
