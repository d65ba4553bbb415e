"""Where a run writes (paper section 4.1: the data mix, the checkpoints that are merged, the merged model): the outputs
folder writable, the future run directory free to create, room on every filesystem the run writes to, and a checkpoint
round trip (written and read back by the probe, `probe.round_trip`).

Nothing is written inside the run directory. Writes are tried in a hidden folder beside it,
`<outputs>/.<run>.preflight-<pid>-*`, which the probes also write their checkpoint, specs and logs into, and which is
removed after; one left by a killed preflight (its process gone) is removed by the next preflight of the same run.

The sizes are estimates from the recipe (`basis` computed), stated per item: the data mix from its sources' sizes
(a row holds its query, positive and K negatives: about (2 + K) / 2 times the pairs' text), the checkpoints as
counted by the schedule at the probe's measured checkpoint size (or `scale.checkpoint_bytes` where a stand-in model
was measured), the merged model and the export from the backbone's parameter count.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from c2llm_lib.files import scratch_folder as owned_folder

from ..scale import Arch, backbone_params, checkpoint_bytes, lora_params, pma_params
from .report import Check, Limits, gib
from .setup import Setup

SPARE = 0.8  # a run should need at most this share of a filesystem's free space
PROBE_BYTES = 1 << 20  # written and read back to prove the outputs folder writable
PAIR_BYTES = 2048  # assumed text of one query-positive pair where no source size is known (stated in the check)


def nearest_existing(path: Path) -> Path:
    """`path` or its closest existing ancestor (what a filesystem question can be asked of)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def scratch_folder(setup: Setup) -> tuple[Path | None, Check]:
    """A hidden folder beside the run directory in which writes are tried (None when the outputs folder is not
    writable), and the check: the outputs folder created if needed, a file written, synced, read back and removed."""
    outputs = setup.outputs
    try:
        outputs.mkdir(parents=True, exist_ok=True)
        folder = owned_folder(outputs, f".{setup.name}.preflight-")  # and those of killed preflights removed
        data = os.urandom(PROBE_BYTES)
        with open(folder / "probe.bin", "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if (folder / "probe.bin").read_bytes() != data:
            raise OSError("the bytes read back differ from those written")
        (folder / "probe.bin").unlink()
    except OSError as err:
        return None, Check("writes", "outputs folder", "fail", f"{outputs}: not writable",
                           f"{type(err).__name__}: {err}. The run writes outputs/<run>/ here: choose a writable "
                           "folder with --outputs, or fix its permissions")  # fmt: skip
    return folder, Check("writes", "outputs folder", "pass", f"{outputs}: wrote, synced and read back "
                         f"{gib(PROBE_BYTES)}", f"in {folder.name}, removed after")  # fmt: skip


def check_run_dir(setup: Setup) -> Check:
    """The run directory a new run would create: absent (or empty) is ready; a run there already is refused by a new
    run (a warning naming --resume and --overwrite); something that is not a folder is a failure."""
    root = setup.run_dir
    if root.is_symlink() and not root.exists():
        return Check("writes", "run directory", "fail", f"{root}: a dangling symlink", "remove it or choose --outputs")
    if not root.exists():
        return Check("writes", "run directory", "pass", f"{root}: not there yet (a run creates it)")
    if not root.is_dir():
        return Check(
            "writes",
            "run directory",
            "fail",
            f"{root}: not a folder",
            "a run keeps its files in a folder of this name: move the file, or rename the params file",
        )
    held = [p.name for p in root.iterdir() if p.name != ".lock"]
    if (root / "manifest.json").is_file():
        return Check("writes", "run directory", "warn", f"{root}: holds a run ({len(held)} entries)",
                     "a new run is refused here: continue it with --resume, replace it with --overwrite, or rename "
                     "the params file")  # fmt: skip
    if held:
        return Check(
            "writes",
            "run directory",
            "warn",
            f"{root}: holds {len(held)} entries but no run",
            "a new run is refused in a folder that is not empty: move them, or rename the params file",
        )
    return Check("writes", "run directory", "pass", f"{root}: empty")


@dataclass
class Need:
    """Bytes the run writes to a place (an item of the disk estimate)."""

    label: str
    where: Path
    nbytes: float
    how: str  # how it was estimated


def data_needs(setup: Setup, source_bytes: int | None, from_hub: bool) -> list[Need]:
    """The data mix in the run directory and its scratch tables in the temporary folder (notebook 01); with hub
    sources, their download and Arrow copy in the hub cache."""
    from huggingface_hub import constants

    k = setup.data.num_negatives
    factor = (2 + k) / 2
    if (setup.run_dir / "data" / "train").is_dir():
        return []
    if setup.data.data_source == "offline":
        from c2llm_lib.data.offline import load_snapshot

        text = sum(len(r["query"].encode()) + len(r["positive"].encode()) for r in load_snapshot())
        how = "the offline snapshot's text"
    elif source_bytes:
        text, how = source_bytes, "the sources' files"
    else:
        from ..scale import PAPER_PAIRS

        text, how = PAPER_PAIRS * PAIR_BYTES, f"the paper's ~3M pairs at an assumed {PAIR_BYTES} bytes of text each"
    needs = [Need("data mix (data/train)", setup.run_dir, text * factor, f"{how} x (2 + K) / 2 = x {factor:g}"),
             Need("scratch tables (notebook 01)", Path(tempfile.gettempdir()), text * (1 + factor),
                  "the rows, then the rows with negatives, before data/train is saved")]  # fmt: skip
    if from_hub and source_bytes:
        needs.append(Need("hub downloads and Arrow copies", Path(constants.HF_HUB_CACHE), 2 * source_bytes,
                          "the sources' files, twice"))  # fmt: skip
    return needs


def model_needs(setup: Setup, arch: Arch | None, checkpoints: int, measured_checkpoint: int | None,
                half: bool) -> list[Need]:  # fmt: skip
    """The checkpoints (notebook 02), the merged model and the export (notebook 03); `half`: training in 16 bits, whose
    merged/ keeps the base in that dtype beside the stacked adapter (`merge.merge_as_adapter`)."""
    if arch is None:
        return []
    model = setup.model
    lora = lora_params(arch, model.lora_r, tuple(model.lora_targets))
    head = pma_params(arch.hidden) if model.pooling == "pma" else 0
    needs = []
    if setup.trains:
        each = measured_checkpoint or checkpoint_bytes(lora + head)
        how = "measured size of one" if measured_checkpoint else "LoRA + head + AdamW moments, fp32"
        needs.append(Need(f"{checkpoints} checkpoints", setup.run_dir, checkpoints * each, f"{how} x {checkpoints}"))
    if setup.runs("03"):
        params = backbone_params(arch)
        merged = 2 * params + setup.merge.merge_last * 4 * lora if half else 4 * params
        needs.append(Need("merged model and export", setup.run_dir, merged + 4 * params + 4 * head,
                          "the merged backbone (its dtype) and the float32 export"))  # fmt: skip
    return needs


def check_disk(needs: list[Need], limits: Limits, unknown: list[str]) -> Check:
    """Every filesystem the run writes to has its share of `needs` free, with room to spare; a budget
    (--disk-gb) caps all of them together."""
    by_fs: dict[int, list[Need]] = {}
    anchors: dict[int, Path] = {}
    for need in needs:
        anchor = nearest_existing(need.where)
        device = anchor.stat().st_dev
        by_fs.setdefault(device, []).append(need)
        anchors.setdefault(device, anchor)
    total = sum(n.nbytes for n in needs)
    figures, status, problems = [], "pass", []
    values = {"needs": [{"label": n.label, "where": str(n.where), "bytes": n.nbytes, "how": n.how} for n in needs],
              "filesystems": []}  # fmt: skip
    for device, items in by_fs.items():
        need = sum(n.nbytes for n in items)
        free = shutil.disk_usage(anchors[device]).free
        values["filesystems"].append({"at": str(anchors[device]), "need_bytes": need, "free_bytes": free})
        figures.append(f"{gib(need)} of {gib(free)} free at {anchors[device]}")
        if need > free:
            status = "fail"
            problems.append(f"{anchors[device]} has {gib(free)} free, the run needs {gib(need)} there ("
                            + ", ".join(f"{n.label} {gib(n.nbytes)}" for n in items) + ")")  # fmt: skip
        elif need > SPARE * free and status != "fail":
            status = "warn"
            problems.append(f"{anchors[device]}: the run would fill {need / free:.0%} of its free space")
    if limits.disk_gb is not None:
        budget = limits.disk_gb * 2**30
        figures.append(f"{gib(total)} of the {gib(budget)} budget")
        values["budget_bytes"] = budget
        if total > budget:
            status = "fail"
            problems.append(f"the run needs {gib(total)}, over the disk budget of {gib(budget)} (--disk-gb)")
    message = "; ".join(problems)
    if problems:
        message += ": free space there, or write elsewhere (--outputs; TMPDIR for notebook 01's scratch tables)"
    estimated = "; ".join(f"{n.label}: {gib(n.nbytes)} ({n.how})" for n in needs)
    missing = f"; not counted (size unknown): {', '.join(unknown)}" if unknown else ""
    message = (message + " | " if message else "") + f"estimated: {estimated}{missing}"
    return Check("writes", "disk", status, "; ".join(figures) or "nothing to write", message, "computed", values)


def round_trip_check(found: dict | None, error: str, stand_in: str) -> Check:
    """The probe's checkpoint written and read back equal."""
    if not found:
        return Check("writes", "checkpoint round trip", "fail", "not tried", error or "the probe wrote no checkpoint")
    figure = (f"{found['tensors']} tensors ({gib(found['bytes'])}) written in {found['seconds']:.2f} s and read back "
              + ("equal" if found["equal"] else "different"))  # fmt: skip
    note = f"the adapter, head and optimizer state of {stand_in}, beside the run directory"
    if not found["equal"]:
        return Check("writes", "checkpoint round trip", "fail", figure,
                     f"{'; '.join(found['differences'])}: {note}", values=found)  # fmt: skip
    return Check("writes", "checkpoint round trip", "pass", figure, note, values=found)
