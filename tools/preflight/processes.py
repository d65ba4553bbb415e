"""Several processes (paper section 4.1: in-batch negatives gathered over every GPU's share of the global batch).

With `nproc` > 1, the preflight starts that many processes for a few seconds, as torchrun's ranks would start: NCCL,
one GPU each, on a GPU machine; gloo on a CPU. Each rank reads the trainer's parameters from the file the launcher
would write (`train.launch.trainer_params`, through `train.split_params`), resolves its dtype on its own device, and the
ranks compare both (a rank that differs is named); then they all-gather a tensor the size of a step's embeddings and
all-reduce one the size of the trainable parameters (DDP's gradients), and time that gathered step. With several
machines, this machine's ranks are checked here and `rdzv_endpoint` must resolve; the cross-machine part runs when the
preflight runs on each machine.
"""

from __future__ import annotations

import hashlib
import json
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

from .report import Check, gib
from .setup import Setup

TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_main(rank: int, world: int, port: int, params: str, folder: str, sizes: tuple[int, int, int, bool]) -> None:
    """One rank: the recipe and dtype it resolves, compared with every rank's; a timed gather of `sizes` = (texts,
    width, trainable parameters, on GPUs) and all-reduce."""
    import torch.distributed as dist

    from c2llm_lib.distributed import all_gather_json, gather_with_grad
    from c2llm_lib.hardware import resolve_device, resolve_dtype
    from c2llm_lib.params import read_yaml
    from c2llm_lib.train import split_params

    texts, width, trainable, cuda = sizes
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=TIMEOUT_S))  # fmt: skip
    try:
        model, train = split_params(read_yaml(Path(params).read_text()), params)
        device = resolve_device(model.device if not cuda else f"cuda:{rank}")
        dtype = str(resolve_dtype(model.dtype, device)).removeprefix("torch.")
        recipe = hashlib.sha256(json.dumps([model.to_dict(), train.to_dict()], sort_keys=True).encode()).hexdigest()
        agreed = all_gather_json({"recipe": recipe[:16], "dtype": dtype})
        here = torch.device("cuda", rank) if cuda else torch.device("cpu")
        embeddings = torch.randn(texts, width, device=here, requires_grad=True)  # (b, d) this rank's share
        grads = torch.zeros(trainable, device=here)  # (P,) DDP's gradient all-reduce
        dist.barrier()
        tick = time.perf_counter()
        gathered = gather_with_grad(embeddings)  # (W * b, d)
        gathered.sum().backward()
        dist.all_reduce(grads)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - tick
        times = all_gather_json(seconds)
        if rank == 0:
            out = {"ranks": agreed, "seconds": times, "gathered_rows": int(gathered.shape[0]),
                   "reduced_bytes": grads.numel() * 4, "backend": dist.get_backend()}  # fmt: skip
            Path(folder, "result.json").write_text(json.dumps(out))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def check_processes(setup: Setup, nproc: int, texts: int, width: int, trainable: int,
                    folder: Path | None = None) -> Check:  # fmt: skip
    """The ranks of this machine start, agree on the recipe and dtype, and gather; several machines: the endpoint.
    Their params and result go in a folder inside `folder` (the preflight's scratch), else the system's temporary
    folder."""
    world = nproc * setup.launch.nnodes
    if world == 1:
        return Check("processes", "ranks", "pass", "1 process: nothing to gather", basis="given")
    notes = []
    if setup.launch.nnodes > 1:
        host, port = setup.launch.rdzv_endpoint.rsplit(":", 1)
        try:
            socket.getaddrinfo(host.strip("[]"), int(port))
        except OSError as err:
            return Check("processes", "ranks", "fail", f"rdzv_endpoint {setup.launch.rdzv_endpoint}: does not resolve",
                         f"{err}: set rdzv_endpoint to node 0's host:port as every machine names it")  # fmt: skip
        notes.append(f"rdzv_endpoint {setup.launch.rdzv_endpoint} resolves; the ranks of the other "
                     f"{setup.launch.nnodes - 1} machine(s) are checked by the preflight run on each")  # fmt: skip
    if nproc == 1:
        return Check("processes", "ranks", "pass", f"1 process here, {world} in all", "; ".join(notes))
    from c2llm_lib.train.launch import trainer_params

    cuda = torch.cuda.is_available() and setup.model.device in ("auto", "cuda")
    with tempfile.TemporaryDirectory(prefix="c2llm-preflight-ranks-", dir=folder) as tmp:
        params = Path(tmp) / "params.yaml"
        params.write_text(trainer_params(setup.model, setup.train))
        error = spawn(nproc, (free_port(), str(params), tmp, (texts, width, trainable, cuda)))
        result = Path(tmp) / "result.json"
        found = json.loads(result.read_text()) if result.is_file() else None
    if found is None:
        return Check("processes", "ranks", "fail", f"{nproc} processes did not finish", error)
    ranks = found["ranks"]
    differ = [r for r, v in enumerate(ranks) if v != ranks[0]]
    seconds = max(found["seconds"])
    figure = (f"{nproc} ranks ({found['backend']}) agree; gathered {found['gathered_rows']} x {width} embeddings and "
              f"all-reduced {gib(found['reduced_bytes'])} in {seconds * 1000:.0f} ms")  # fmt: skip
    if differ:
        return Check(
            "processes",
            "ranks",
            "fail",
            f"{nproc} ranks disagree",
            f"rank(s) {differ} resolve {[ranks[r] for r in differ]}, rank 0 {ranks[0]}: every machine needs "
            "the same library and the same dtype (set dtype explicitly rather than auto)",
            values=found,
        )
    return Check("processes", "ranks", "pass", figure, "; ".join(notes), values=found)


def spawn(nproc: int, args: tuple) -> str:
    """Runs `rank_main` in `nproc` spawned processes; '' when all exit cleanly, else why not (a stuck one is killed)."""
    import torch.multiprocessing as mp

    context = mp.start_processes(rank_main, args=(nproc, *args), nprocs=nproc, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                return f"the processes did not finish within {TIMEOUT_S:.0f} s (a rank hangs: check the backend)"
    except mp.ProcessRaisedException as err:
        return f"a rank failed: {str(err).strip().splitlines()[-1]}"
    except mp.ProcessExitedException as err:
        return f"a rank exited: {err}"
    finally:
        for proc in context.processes:
            if proc.is_alive():
                proc.kill()
    return ""
