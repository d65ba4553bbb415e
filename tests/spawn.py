"""Runs a function in N spawned processes (a gloo process group per test) and collects their results."""

import os
import tempfile

import torch.multiprocessing as mp


def run_processes(target, world: int, *args, timeout: int = 300) -> dict:
    """target(rank, world, init_file, out, *args) in `world` processes; returns {rank: what it put in out}."""
    with tempfile.TemporaryDirectory() as tmp:
        manager = mp.Manager()
        out = manager.dict()
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(target=target, args=(r, world, os.path.join(tmp, "init"), out, *args)) for r in range(world)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=timeout)
            assert proc.exitcode == 0, f"worker exited with {proc.exitcode}"
        result = dict(out)
        manager.shutdown()
        return result
