"""Memory and speed of the recipe on this machine's devices (paper section 4.1 training, section 4.2 evaluation).

`run_probes` starts one `probe.py` child per device (every GPU the run trains on at once, as the run will; one on a
CPU) and collects what each measured. From that:

- memory: the largest batch's peak against each device's budget; when it does not fit, the first device's probe has
  measured the settings that lower it (`probe.search_memory`), in this order, until one fits: gradient checkpointing,
  then GradCache at the run's chunk, then halved chunks (and back up by bisection to the largest chunk that fits). The
  suggestion is a measured one.
- speed: tokens/s of the timed steps and their MFU against the GEMM peak measured in the same process;
- projection: the run's optimizer steps (`setup.row_count`) at the measured seconds per step, its checkpoints at the
  measured seconds per checkpoint, and the evaluation's tokens at the inference rate measured for the form notebook 04
  encodes (`probe.measure_evaluation`: the model's pass with the merged adapter, the untrained baselines' on the bare
  backbone; the median of several timed passes, `probe.time_passes`), with the range the passes' quartiles give:
  where those differ by more than SPREAD_LIMIT, the evaluation's time is labelled an estimate with that range. Where
  the run's backbone could not be loaded and no GPU can hold random weights of its architecture, the tiny model stands
  in: its rates are shown, and the projection is computed from the run's architecture's FLOPs (`scale.py`, the merged
  adapter's rank counted) at the measured GEMM peak and the plan's assumed MFU (35 %), and says so.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from c2llm_lib.batching import local_batch_size
from c2llm_lib.config import ModelConfig, TrainConfig
from c2llm_lib.distributed import die_with_parent
from c2llm_lib.eval.tasks import TaskSets
from c2llm_lib.hardware import resolve_dtype

from ..scale import Arch, forward_flops_per_token, step_flops, step_keywords
from .probe import ROOM, TRAINING, ProbeResult, ProbeSpec
from .report import Check, Limits, duration, gib
from .setup import RowCount, Setup, world_size

TOOLS_ROOT = Path(__file__).resolve().parents[2]  # the repository that holds tools/
ASSUMED_MFU = 0.35  # the plan's assumption (benchmarks/paper_scale_plan.py), used only where nothing was measured
WARN_SHARE = ROOM  # a peak above this share of the budget leaves too little room: a warning
SPREAD_LIMIT = 1.5  # the timed inference passes' third quartile over their first beyond which the evaluation time is
# labelled an estimate


@dataclass
class Subject:
    """The model the probes measure: the run's own, random weights of its architecture, or the tiny stand-in."""

    model: ModelConfig
    train: TrainConfig
    arch: Arch | None  # build random weights of this architecture (None: load `model` as the run does)
    description: str
    stand_in: bool  # True: not the run's architecture (the tiny model)
    run_arch: Arch | None  # the run's backbone's architecture (for the computed figures)


def subject(setup: Setup, device: torch.device, loadable: bool, run_arch: Arch | None) -> Subject:
    """What the probes measure on `device`: the run's backbone when its weights can be had; on a GPU random weights
    of its architecture when that is known; else (a CPU) the tiny random model."""
    from c2llm_lib.model.backbone import TINY_BACKBONE

    model, train = setup.model, setup.train
    if loadable:
        return Subject(model, train, None, f"the run's backbone ({model.backbone})", False, run_arch)
    if device.type == "cuda" and run_arch is not None:
        return Subject(model, train, run_arch, f"random weights of {run_arch.name}'s architecture (its weights cannot "
                       "be had here)", False, run_arch)  # fmt: skip
    tiny = dataclasses.replace(model, backbone=TINY_BACKBONE, backbone_revision=None, gguf_file=None)
    width = tiny.embedding_dim or 64
    dims = [d for d in train.mrl_dims if d < width]  # MRL widths the tiny model has
    weights = [w for d, w in zip(train.mrl_dims, train.mrl_weights, strict=False) if d < width]
    tiny_train = dataclasses.replace(train, mrl_dims=dims, mrl_weights=weights if train.mrl_weights else [])
    return Subject(tiny, tiny_train, None, f"the tiny random model standing in for {model.backbone} (its weights are "
                   "not here; on a CPU no random 0.5B or 7B is built)", True, run_arch)  # fmt: skip


def rows_per_process(setup: Setup, nproc: int) -> int:
    """The rows of one global batch each training process embeds, by the sampler's own rule
    (`batching.local_batch_size`: a batch the ranks cannot split evenly is a ValueError, as at rank start)."""
    return local_batch_size(setup.train.global_batch_size, world_size(setup, nproc))


def probe_spec(setup: Setup, who: Subject, nproc: int, limits: Limits, checkpoint_dir: Path | None,
               measure: list[str], device: torch.device) -> ProbeSpec:  # fmt: skip
    """The child's instructions for the run's recipe on one device."""
    share = 1.0 if device.type == "cuda" else 1.0 / nproc  # processes on a CPU share its memory
    budget = None if limits.memory_gb is None else limits.memory_gb * 2**30 * share
    return ProbeSpec(
        model={**who.model.to_dict(), "device": "cuda" if device.type == "cuda" else who.model.device},
        train=who.train.to_dict(),
        rows=rows_per_process(setup, nproc) if TRAINING & set(measure) else 0,
        negatives=min(who.train.num_negatives, setup.data.num_negatives),
        budget_bytes=budget, share=share, measure=measure, steps=limits.steps,
        arch=dataclasses.asdict(who.arch) if who.arch else None,
        eval_batch_size=setup.evaluation.eval_batch_size, eval_max_length=setup.evaluation.eval_max_length,
        eval_adapter_rank=evaluated_rank(setup), eval_untrained=bool(untrained_sets(setup)),
        checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir), seed=setup.train.seed,
    )  # fmt: skip


MERGE_DEVICE = torch.device("cpu")  # where notebook 03 merges: `merge.evaluation_form(..., device="cpu")`


def evaluated_rank(setup: Setup) -> int | None:
    """The LoRA rank of the merged model notebook 04 encodes, or None where it encodes no adapter (a release, a
    training without LoRA, a dense merge). `merge.evaluation_form`'s rule: a training in 16 bits, its dtype resolved on
    the merge's device, keeps the merge as one adapter stacking merge_last checkpoints' (merge_last x lora_r); after
    float32 the update is folded in. With `--only 04`, the merged model an earlier notebook 03 left, where its record
    can be read."""
    if setup.evaluation.eval_released:
        return None
    record = setup.run_dir / "merged" / "c2llm_config.json"
    if not setup.runs("03") and record.is_file():
        try:
            saved = json.loads(record.read_text())["model"]
            rank, lora = saved["lora_r"], saved["use_lora"]
        except (OSError, ValueError, KeyError, TypeError):  # notebook 04 will name what is wrong with it
            rank, lora = None, None
        if lora is False:
            return None
        if lora is True and type(rank) is int and rank > 0:  # a crafted rank (0, -5, "64", true) is not timed
            return rank
    if not setup.model.use_lora or resolve_dtype(setup.model.dtype, MERGE_DEVICE) == torch.float32:
        return None
    return setup.merge.merge_last * setup.model.lora_r


def untrained_sets(setup: Setup) -> list[str]:
    """The task sets the untrained baselines encode, in one pass shared by both poolers: those `untrained_sets`
    names, where notebook 04 loads the baselines at all (`eval.scoring.scores_untrained`)."""
    from c2llm_lib.eval.scoring import scores_untrained

    ev = setup.evaluation
    return list(ev.untrained_sets) if scores_untrained(ev) else []


def child_env(gpu: int | None) -> dict[str, str]:
    """This library first on the children's path (as torchrun's ranks get it), then the repository these tools lie in
    (the probe is `tools.preflight.probe`), one GPU each when there are GPUs."""
    from c2llm_lib.train.launch import library_env

    env = {**library_env(), "HF_HUB_OFFLINE": "1"}  # a probe loads what is here: no multi-GB download
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(TOOLS_ROOT)])
    if gpu is not None:  # the gpu-th device this process sees, whatever CUDA_VISIBLE_DEVICES already narrows
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        env["CUDA_VISIBLE_DEVICES"] = visible[gpu] if gpu < len(visible) else str(gpu)
    return env


def failure(proc: subprocess.Popen, log: Path, timeout: float, timed_out: bool) -> str:
    """Why a child left no result: its time limit, a signal (SIGKILL: the kernel's out-of-memory killer, usually),
    or an exit with the end of its output."""
    tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-6:]) if log.is_file() else ""
    if timed_out:
        return f"the measurement did not finish within {timeout:.0f} s and was stopped"
    code = proc.returncode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        oom = " (out of memory: the kernel's OOM killer sends it)" if -code == signal.SIGKILL else ""
        return f"the measuring process was killed by {name}{oom}"
    return f"the measuring process exited with status {code}: {tail}"


def run_probes(specs: list[tuple[ProbeSpec, int | None]], timeout: float,
               folder: Path | None = None) -> list[tuple[ProbeResult | None, str]]:  # fmt: skip
    """Runs one child per (spec, GPU index or None) at once; [(result, '') or (None, why it gave none)]. The children's
    specs, results and logs go in a folder inside `folder` (the preflight's scratch beside the run, which the next
    preflight removes when this one is killed), else in the system's temporary folder."""
    out: list[tuple[ProbeResult | None, str]] = []
    with tempfile.TemporaryDirectory(prefix="c2llm-preflight-", dir=folder) as tmp:
        procs = []
        try:
            for i, (spec, gpu) in enumerate(specs):
                work = Path(tmp)
                (work / f"spec-{i}.json").write_text(json.dumps(dataclasses.asdict(spec)))
                log = (work / f"log-{i}.txt").open("w")
                cmd = [sys.executable, "-m", "tools.preflight.probe", str(work / f"spec-{i}.json"),
                       str(work / f"out-{i}.json")]  # fmt: skip
                # the kernel kills a probe when the preflight dies: no measuring process is left holding a GPU
                dies = functools.partial(die_with_parent, os.getpid(), signal.SIGKILL)
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env(gpu),
                                              preexec_fn=dies))  # fmt: skip
                log.close()
            deadline = time.monotonic() + timeout
            for i, proc in enumerate(procs):
                timed_out = False
                try:
                    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    timed_out = True
                result = Path(tmp) / f"out-{i}.json"
                if result.is_file() and not timed_out:
                    out.append((ProbeResult(**json.loads(result.read_text())), ""))
                else:
                    out.append((None, failure(proc, Path(tmp) / f"log-{i}.txt", timeout, timed_out)))
        finally:
            for proc in procs:  # an interrupted preflight leaves no child behind
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    return out


# memory ------------------------------------------------------------------------------------------------------------
def mode(model: dict[str, Any] | ModelConfig, train: dict[str, Any] | TrainConfig) -> str:
    """The settings that decide a step's memory, in words."""
    get = (lambda c, k: c[k]) if isinstance(model, dict) else getattr  # noqa: E731
    checkpointing = "gradient checkpointing" if get(model, "gradient_checkpointing") else "no gradient checkpointing"
    cache = (f"GradCache chunk {get(train, 'grad_cache_chunk')}" if get(train, "grad_cache")
             else "no GradCache: every micro-batch's graph kept")  # fmt: skip
    return f"{checkpointing}, {cache}"


def fits(found: tuple[ProbeResult | None, str]) -> tuple[bool, str]:
    """(whether a device's largest batch fitted, its peak in words)."""
    result, why = found
    if result is None:
        return False, why
    memory = result.memory
    if not memory:
        return False, result.error.splitlines()[0] if result.error else "not measured"
    if memory.get("out_of_memory"):
        return False, f"out of memory ({memory.get('error', '')[:120]})"
    peak, budget = memory.get("peak_bytes", 0), memory.get("budget_bytes")
    return bool(memory.get("fits")), f"peak {gib(peak)}" + (f" of {gib(budget)}" if budget else "")


def unmeasured(found: tuple[ProbeResult | None, str]) -> str:
    """Why a device has no memory figure for a reason other than memory ('' when it has one, or ran out of memory: a
    SIGKILL is the kernel's out-of-memory killer)."""
    result, why = found
    if result is None:
        return "" if "SIGKILL" in why else why
    return "" if result.memory else (result.error.splitlines()[0] if result.error else "not measured")


def settings_text(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {json.dumps(v)}" for k, v in overrides.items())


def suggestion_text(found: list[tuple[ProbeResult | None, str]]) -> str:
    """The measured setting that fits (from the first device's search), or why none was found."""
    first = next((r for r, _ in found if r is not None and r.memory.get("search")), None)
    if first is None:
        return ("no setting was searched (the measuring process ended: give --memory-gb below the memory "
                "to search within it)")  # fmt: skip
    search = first.memory["search"]
    suggestion, trials = search["suggestion"], search["trials"]
    if suggestion is not None:
        fitted = next(t for t in reversed(trials) if t["fits"] and t["settings"] == suggestion)
        return f"set {settings_text(suggestion)} (measured: peak {gib(fitted['peak_bytes'])})"
    tried = "; ".join(f"{settings_text(t['settings'])}: peak {gib(t['peak_bytes'])}" for t in trials) or "none"
    return (f"no setting of gradient checkpointing and GradCache fits (tried {tried}): train on more processes "
            "(nproc, nnodes) or lower max_length")  # fmt: skip


def memory_check(setup: Setup, spec: ProbeSpec, found: list[tuple[ProbeResult | None, str]], who: Subject) -> Check:
    """The largest batch's peak on each device against its budget; a failure names the measured setting that fits.
    Measured on a stand-in model, a pass is a warning: the figure is not the run's backbone's."""
    texts = spec.rows * (2 + spec.negatives)
    shape = f"{texts} texts x {setup.train.max_length} tokens per process ({spec.rows} rows x (2 + {spec.negatives}))"
    settings = mode(spec.model, spec.train)
    given = spec.budget_bytes is not None
    values = {"texts_per_process": texts, "max_length": setup.train.max_length, "settings": settings,
              "devices": [r.memory if r else {"error": why} for r, why in found], "budget_given": given,
              "measured_on": who.description}  # fmt: skip
    errors = [e for e in map(unmeasured, found) if e]
    if errors:
        return Check("memory", "largest batch", "fail", "not measured", errors[0], values=values)
    bad = [f for f in found if not fits(f)[0]]
    if bad:
        figure = f"{fits(bad[0])[1]} on {len(bad)} of {len(found)} device(s): {shape}, {settings}"
        values["search"] = next((r.memory["search"] for r, _ in found if r and r.memory.get("search")), None)
        budget = " (the budget given by --memory-gb)" if given else ""
        return Check("memory", "largest batch", "fail", figure,
                     f"the largest batch does not fit{budget}: {suggestion_text(found)}", values=values)  # fmt: skip
    peaks = [r.memory for r, _ in found]
    worst = max(peaks, key=lambda m: m["peak_bytes"] / (m.get("budget_bytes") or math.inf))
    budget = worst.get("budget_bytes")
    figure = f"peak {gib(worst['peak_bytes'])}" + (f" of {gib(budget)}" if budget else "") + f": {shape}, {settings}"
    on = f"measured on {who.description}"
    if budget and worst["peak_bytes"] > WARN_SHARE * budget:
        return Check("memory", "largest batch", "warn", figure, f"less than {1 - WARN_SHARE:.0%} of the memory left "
                     "for fragmentation and longer kernels: consider gradient_checkpointing or a smaller "
                     f"grad_cache_chunk; {on}", values=values)  # fmt: skip
    if who.stand_in:
        return Check("memory", "largest batch", "warn", figure, f"{on}: the run's backbone needs more",
                     values=values)  # fmt: skip
    return Check("memory", "largest batch", "pass", figure, on, values=values)


# speed and time -------------------------------------------------------------------------------------------------------
def slowest(found: list[tuple[ProbeResult | None, str]], part: str) -> ProbeResult | None:
    done = [r for r, _ in found if r is not None and getattr(r, part)]
    key = "seconds_per_step" if part == "speed" else "seconds"
    return max(done, key=lambda r: getattr(r, part)[key], default=None)


def speed_check(setup: Setup, found: list[tuple[ProbeResult | None, str]], who: Subject) -> tuple[Check, float | None]:
    """Training tokens/s and MFU of the slowest device; (check, seconds per step or None)."""
    result = slowest(found, "speed")
    if result is None:
        why = next((r.error.splitlines()[0] if r else w for r, w in found if (r and r.error) or w), "")
        if not why:  # the memory check fails, naming what to change: this line only says why it has no figure
            return Check("speed", "training", "warn", "not measured", "the largest batch does not fit (memory)"), None
        return Check("speed", "training", "fail", "not measured", why), None
    speed, gemm = result.speed, result.gemm_gflops
    figure = (
        f"{speed['tokens_per_second']:,.0f} tokens/s per process, {speed['seconds_per_step']:.2f} s per step, "
        f"MFU {speed['mfu']:.1%} of {gemm['peak']:,.0f} GFLOP/s ({gemm['dtype']} GEMM measured here)"
    )
    first = "; one step timed (the memory step: first-call overheads included)" if speed.get("first_step_only") else (
        f"; {speed['steps']} steps timed after the memory step")  # fmt: skip
    message = f"measured on {who.description}, every text at max_length (an upper bound on a step){first}"
    values = {**speed, "gemm_gflops": gemm, "devices": len(found), "backbone": result.backbone, "dtype": result.dtype}
    status = "warn" if who.stand_in else "pass"
    return Check("speed", "training", status, figure, message, values=values), speed["seconds_per_step"]


def eval_tokens(setup: Setup, tasks: list[Any], chars_per_token: float, sets: TaskSets | None = None) -> dict[str, Any]:
    """The evaluation's texts, tokens (characters / chars_per_token, at most eval_max_length each) and passes: notebook
    04's task sets as `inputs.check_local_sets` built them (held-out, BEIR sets, unseen libraries; the offline
    held-out tasks alone when it could not), each by the model and, sharing one pass, the untrained baselines where
    `untrained_sets` names the set; and each mteb task notebook 04 evaluates (the model). An mteb task counts its
    texts from mteb's statistics of the hub dataset, or, read from a mirror, from the size of the mirror's folder
    (its JSON included: an upper bound)."""
    from c2llm_lib.data.mirror import repo_dir
    from c2llm_lib.eval import offline_tasks

    from .inputs import folder_bytes

    ev = setup.evaluation
    length = ev.eval_max_length
    if sets is None:
        sets = TaskSets(offline_tasks(limit=ev.eval_limit, max_documents=ev.eval_max_documents), [], [], "", {})
    out = {
        "tasks": {},
        "chars_per_token": chars_per_token,
        "tokens": 0.0,
        "untrained_tokens": 0.0,
        "passes_tokens": 0.0,
        "untrained_sets": untrained_sets(setup),
    }  # untrained_sets: the sets given a second pass, by the untrained backbone (untrained_tokens)
    for name, group in (("heldout", sets.heldout), ("beir", sets.beir), ("unseen", sets.unseen)):
        passes = 1 + (name in out["untrained_sets"])
        for task in group:
            texts = [*task.queries.values(), *task.corpus.values()]
            tokens = sum(min(len(t) / chars_per_token, length) for t in texts)
            out["tasks"][task.name] = {"set": name, "texts": len(texts), "tokens": tokens, "passes": passes}
    for task in tasks:
        if ev.hub_mirror is not None:
            local = repo_dir(ev.hub_mirror, task.metadata.dataset["path"])
            chars = folder_bytes(local) if local.is_dir() else 0
            out["tasks"][task.metadata.name] = {"tokens": chars / chars_per_token, "passes": 1, "from": str(local)}
            continue
        stats = (task.metadata.descriptive_stats or {}).get(task.metadata.eval_splits[0]) or {}
        texts = (stats.get("num_queries") or 0) + (stats.get("num_documents") or 0)
        chars = stats.get("number_of_characters") or 0
        tokens = min(chars / chars_per_token, texts * length)
        out["tasks"][task.metadata.name] = {"texts": texts, "tokens": tokens, "passes": 1}
    for entry in out["tasks"].values():
        out["tokens"] += entry["tokens"]
        out["untrained_tokens"] += entry["tokens"] * (entry["passes"] - 1)
        out["passes_tokens"] += entry["tokens"] * entry["passes"]
    return out


def chars_per_token(sample: int = 400) -> float:
    """Characters per token of the Qwen2.5 tokenizer on real code and docstrings (the offline snapshot's texts)."""
    from c2llm_lib.data.offline import load_snapshot
    from c2llm_lib.model.backbone import TINY_BACKBONE, load_tokenizer

    tokenizer = load_tokenizer(ModelConfig(backbone=TINY_BACKBONE))
    snapshot = load_snapshot()
    rows = snapshot[:: max(1, len(snapshot) // sample)][:sample]
    texts = [t for r in rows for t in (r["query"], r["positive"])]
    tokens = sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
    return sum(len(t) for t in texts) / max(1, tokens)


def inference_rate(found, who: Subject, setup: Setup,
                   untrained: bool = False) -> tuple[float | None, str, tuple[float, float] | None]:  # fmt: skip
    """(tokens/s of inference at eval_max_length, how it was obtained, (the rates at the passes' third and first
    quartiles) where it was measured; None where it was computed), of the merged model notebook 04 encodes, or with
    `untrained` of the untrained baselines' backbone (`probe.measure_evaluation`: the same form where it times one)."""
    result = slowest(found, "inference")
    if result is None:
        return None, "not measured", None
    model = result.inference
    inference = model.get("untrained", model) if untrained else model
    rank = inference.get("adapter_rank")  # absent: a probe from before it timed notebook 04's forms
    form = f"the base with the merged adapter of rank {rank}" if rank else "the backbone without an adapter"
    form = "the training's adapter" if rank is None else form
    rate = inference["tokens_per_second"]
    if not who.stand_in or who.run_arch is None:
        first, third = inference["quartiles"]
        spread = (inference["tokens"] / third, inference["tokens"] / first)
        return rate, (f"a measured {rate:,.0f} tokens/s (texts of {setup.evaluation.eval_max_length} tokens, "
                      f"{who.description}, {form}; the median of {inference['passes']} timed passes after warm-ups, "
                      f"the middle half of them {first:.3g} to {third:.3g} s)"), spread  # fmt: skip
    gemm = result.gemm_gflops.get("peak", 0.0)
    if not gemm:
        return None, "not measured", None
    flops = forward_flops_per_token(who.run_arch, setup.evaluation.eval_max_length, lora_r=rank or 0,
                                    lora_targets=setup.model.lora_targets)  # fmt: skip
    rate = gemm * 1e9 * ASSUMED_MFU / flops
    return rate, (f"a computed {rate:,.0f} tokens/s ({who.run_arch.name}'s forward FLOPs, {form}, at the measured "
                  f"{gemm:,.0f} GFLOP/s and an assumed MFU of {ASSUMED_MFU:.0%})"), None  # fmt: skip


def step_seconds(setup: Setup, found, who: Subject, spec: ProbeSpec, measured: float) -> tuple[float, str]:
    """Seconds per optimizer step of the run: measured, or (a stand-in) computed from the run's architecture."""
    if not who.stand_in or who.run_arch is None:
        return measured, "measured"
    result = slowest(found, "speed")
    gemm = result.gemm_gflops["peak"]
    texts = spec.rows * (2 + spec.negatives)
    flops = step_flops(who.run_arch, texts, setup.train.max_length, setup.model.gradient_checkpointing,
                       setup.train.grad_cache, **step_keywords(setup.model, who.run_arch))  # fmt: skip
    return flops / (gemm * 1e9 * ASSUMED_MFU), (
        f"computed: {who.run_arch.name}'s FLOPs per step at the measured "
        f"{gemm:,.0f} GFLOP/s and an assumed MFU of {ASSUMED_MFU:.0%}"
    )


def comparison_trainings(setup: Setup) -> int:
    """The trainings notebook 06 runs on this run's compute, each counted at this run's seconds per step:
    `study.plan.plan`'s (each recipe, each PMA recipe again at every width of compare_pma_dims, and the pooling study's
    poolers and widths) once per seed of compare_seeds, and with compare_sweep every grid point of each full-width
    model, each a training of its own: the sweep trains at `sweep_seed`, never a comparison seed, so no comparison
    training is the sweep's chosen point."""
    if not setup.trains or not setup.runs("06"):
        return 0
    from c2llm_lib.study.plan import plan
    from c2llm_lib.study.sweep import Grid, points

    compare = setup.compare
    entries = plan(setup.model, setup.train, compare.compare_recipes, compare.compare_dims, compare.compare_pma_dims,
                   poolings=compare.compare_poolings)  # fmt: skip
    total = len(entries) * max(1, len(compare.compare_seeds))
    if compare.compare_sweep:
        grid = Grid(compare.sweep_learning_rates, compare.sweep_pma_learning_rates,
                    compare.sweep_pma_attention_learning_rates)  # fmt: skip
        total += sum(len(points(e.model, e.train, grid)) for e in entries if e.parent is None)
    return total


@dataclass
class Projection:
    train_seconds: float | None = None
    eval_seconds: float | None = None
    notes: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)


def projection_check(setup: Setup, found, who: Subject, spec: ProbeSpec, per_step: float | None, rows: RowCount,
                     steps: int, checkpoints: int, tasks: list[Any], nproc: int, device: torch.device,
                     sets: TaskSets | None = None) -> Check:  # fmt: skip
    """The whole run's wall time: training steps and checkpoints, and the evaluation (`eval_tokens`, on `sets`)."""
    p = Projection()
    if setup.trains and per_step is not None:
        seconds, how = step_seconds(setup, found, who, spec, per_step)
        if device.type == "cpu" and nproc > 1:  # the processes share the CPU's cores
            seconds *= nproc
            how += f", x {nproc} processes sharing the CPU"
        saved = next((r.checkpoint for r, _ in found if r is not None and r.checkpoint), {})
        trainings = int(setup.runs("02")) + comparison_trainings(setup)
        p.train_seconds = trainings * steps * seconds + checkpoints * saved.get("seconds", 0.0)
        times = f"{trainings} trainings (the run's and notebook 06's) x " if trainings > 1 else ""
        p.notes.append(f"training: {times}{steps:,} steps x {seconds:.3g} s ({how}) + {checkpoints} checkpoints; "
                       f"rows: {rows.source}; every text at max_length (an upper bound)")  # fmt: skip
        p.values.update(steps=steps, trainings=trainings, seconds_per_step=seconds, step_basis=how,
                        checkpoints=checkpoints, train_seconds=p.train_seconds)  # fmt: skip
    elif setup.trains:
        p.notes.append("training: not projected, no step was measured (see speed/training)")
    evaluation = ""
    if setup.runs("04"):
        rate, how, spread = inference_rate(found, who, setup)
        counted = eval_tokens(setup, tasks, chars_per_token(), sets)
        untrained = counted["untrained_tokens"]
        if untrained:
            rate_u, how_u, spread_u = inference_rate(found, who, setup, untrained=True)
        else:
            rate_u, how_u, spread_u = rate, "", spread
        if rate and rate_u:
            tokens = counted["tokens"]
            p.eval_seconds = tokens / rate + untrained / rate_u
            evaluation = f"evaluation {duration(p.eval_seconds)}"
            if spread is not None and spread_u is not None:  # the passes' spread: measured where they agree
                fast = tokens / spread[1] + untrained / spread_u[1]
                slow = tokens / spread[0] + untrained / spread_u[0]
                varied = max(spread[1] / spread[0], spread_u[1] / spread_u[0])
                estimate = varied > SPREAD_LIMIT
                span = f"{duration(fast)} to {duration(slow)}"
                how += (f"; an estimate: the middle half of the passes varied {varied:.1f}x, so the evaluation may "
                        f"take {span}" if estimate else f"; measured: {span} over the middle half of the passes "
                        f"(within {SPREAD_LIMIT}x)")  # fmt: skip
                evaluation += f" (an estimate: {span})" if estimate else ""
                p.values.update(eval_seconds_range=[fast, slow], eval_basis="estimate" if estimate else "measured")
            if sets is None:
                local = "the offline held-out tasks alone (the evaluation sets were not read: inputs/evaluation sets)"
            else:
                read = [n for n, group in (("BEIR sets", sets.beir), ("unseen libraries", sets.unseen)) if group]
                local = ", ".join(["the held-out tasks", *read])
            mteb = " and the mteb tasks" if tasks else ""
            baselines = (f"; and the untrained baselines' shared pass, {untrained:,.0f} tokens over the sets "
                         f"untrained_sets names ({', '.join(counted['untrained_sets'])}), at {how_u}"
                         if untrained else "; no untrained baselines' pass")  # fmt: skip
            p.notes.append(f"evaluation: the model's pass, {tokens:,.0f} tokens over {len(counted['tasks'])} tasks: "
                           f"{local}{mteb} ({counted['chars_per_token']:.2f} characters per token, measured on real "
                           f"code), at {how}{baselines}")  # fmt: skip
        p.values.update(evaluation=counted, eval_seconds=p.eval_seconds, eval_rate=rate, eval_untrained_rate=rate_u)
    parts = [f"training {duration(p.train_seconds)}" if p.train_seconds is not None else "", evaluation]
    parts = [x for x in parts if x] + (["training not projected"] if setup.trains and per_step is None else [])
    if p.train_seconds is None and p.eval_seconds is None:
        return Check("speed", "projection", "warn", "not projected", "no step or inference rate was measured (see "
                     "speed/training)")  # fmt: skip
    total = (p.train_seconds or 0) + (p.eval_seconds or 0)
    computed = who.stand_in or not rows.exact
    partial = setup.trains and p.train_seconds is None  # the evaluation alone: no total for the run
    figure = ", ".join(parts) + ("" if partial else f"; {duration(total)} in all")
    return Check("speed", "projection", "warn" if partial else "pass", figure, " | ".join(p.notes),
                 "computed" if computed else "measured", {**p.values, "total_seconds": total})  # fmt: skip


def gpus_for(device: torch.device, nproc: int) -> list[int | None]:
    """The GPUs to measure on, one child each (the run's local ranks, or the one GPU it pins), or [None] for a CPU."""
    if device.type != "cuda":
        return [None]
    if nproc == 1:
        return [device.index or 0]
    return list(range(nproc))
