"""Run directories: `outputs/<run>/` holds everything a run produced, and only `RunDir` writes there.

`INPUTS` and `PRODUCTS` are what each notebook reads and writes. The layout, manifest and lock: docs/runner.md.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from .checks import ConfigError
from .files import MissingInput, atomic_directory, fingerprint, load_json, replace_text
from .hardware import auto_dtype, cpu_info, resolve_device

PRODUCERS = {
    "data/train": "01_data_prep",
    "data/heldout": "01_data_prep",
    "data/eval": "01_data_prep",
    "metrics/data.json": "01_data_prep",
    "checkpoints": "02_train_lora_contrastive",
    "metrics/train.json": "02_train_lora_contrastive",
    "merged": "03_merge_checkpoints",
}
# What each notebook reads from the run (fingerprinted for --resume) and writes (replaced by --overwrite --only), as
# globs relative to the run root; an absent input fingerprints as "missing".
INPUTS = {
    "01_data_prep": (),
    "02_train_lora_contrastive": ("data/train",),
    "03_merge_checkpoints": ("checkpoints", "metrics/train.json"),
    # metrics/data.json: the MTEB tasks notebook 01 decontaminated against
    "04_eval_mteb_code": ("merged", "data/heldout", "metrics/data.json"),
    "05_pma_attention": ("merged", "data/heldout"),
    "06_recipe_comparison": ("data/train", "metrics/train.json"),
    "07_search_code": ("merged",),
}
# Notebooks whose folders outside the run are not fingerprinted: --resume always reruns them (docs/runner.md)
OUTSIDE_INPUTS = {"07_search_code": "the folders it searches lie outside the run"}
PRODUCTS = {
    "01_data_prep": ("data", "metrics/data.json", "figures/data_lengths.png"),
    "02_train_lora_contrastive": ("checkpoints", "metrics/train.json", "figures/loss.png", "logs/02_train"),
    "03_merge_checkpoints": ("merged", "export", "metrics/merge.json"),
    "04_eval_mteb_code": (
        "mteb",
        "metrics/eval.json",
        "metrics/eval_tasks.json",
        "metrics/eval_queries.json",
        "metrics/eval_intervals.json",
        "metrics/results.md",
        "metrics/beir*.json",
        "metrics/unseen*.json",
        "figures/scores.png",
        "metrics/ablations.*",  # written before its quick ablation moved to notebook 06: removed on a rerun
        "metrics/ablations_intervals.json",
        "figures/ablation_*",
        "metrics/mteb_code.*",
        "metrics/mteb_code_tasks.json",
    ),
    "05_pma_attention": ("metrics/attention.json", "figures/attention_*"),
    "06_recipe_comparison": (
        "comparison",
        "metrics/comparison.*",
        "figures/comparison.png",
        "metrics/sweep.json",
        "metrics/pooling_study.*",
        "figures/pooling_study.png",
    ),
    "07_search_code": ("search", "metrics/search.json", "figures/search.html"),
}
# Products a rerun reads back rather than recomputes, each a cache keyed by what it holds
KEPT_ON_RERUN = {
    "02_train_lora_contrastive": ("checkpoints", "logs/02_train"),
    "04_eval_mteb_code": ("mteb",),
    "06_recipe_comparison": ("comparison",),
    "07_search_code": ("search",),  # the index: a rerun encodes only the files that changed
}
LOCK_FILE = ".lock"
LOCK_NOTE = (
    "This is the lock of the c2llm pipeline runner working in this run (its pid is the line above). Do not delete it "
    "while a run is going: a second runner would be let in. It is released when the runner exits, even when killed."
)
LIBRARIES = ("c2llm_lib", "torch", "transformers", "peft", "datasets", "accelerate", "mteb", "papermill", "bm25s")


RUN_FOLDERS = ("notebooks", "data", "checkpoints", "metrics", "figures")  # what `create` makes in a run directory


def contents(root: Path) -> list[str]:
    """What a run directory holds but its lock and `create`'s empty folders: names, folders with a trailing '/'."""

    def made_empty(p: Path) -> bool:
        return p.name in RUN_FOLDERS and p.is_dir() and not p.is_symlink() and not any(p.iterdir())

    return sorted(
        p.name + ("/" if p.is_dir() else "") for p in root.iterdir() if p.name != LOCK_FILE and not made_empty(p)
    )


def listing(names: list[str], most: int = 6) -> str:
    """'a, b/ and 3 more' for an error message."""
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _delete_inside(path: Path, real_root: Path) -> None:
    """Deletes `path` (a file, a symlink, or a folder without following its symlinks) if it lies in `real_root`."""
    if not path.parent.resolve().is_relative_to(real_root):
        raise FileExistsError(f"{path} lies outside the run directory {real_root}: not deleted")
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path)


class RunInUse(RuntimeError):
    """Another runner holds the run directory's lock; the message names the run."""


def process_start(pid: int) -> str | None:
    """When process `pid` started (/proc/<pid>/stat field 22), to tell it from a later one reusing its pid, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()[19]


def runner_alive(runner: Any) -> bool:
    """Whether the runner a manifest names is another live process on this host (same pid and start time)."""
    if not isinstance(runner, dict) or runner.get("host") != platform.node():
        return False
    pid = runner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    start = process_start(pid)
    return runner.get("start") is None or start is None or start == runner.get("start")


def check_run_name(name: str, source: str = "run name") -> str:
    """`name` if it is a plain directory name; `.`, `..`, an empty name or a path separator is refused."""
    if not isinstance(name, str) or name.strip() in ("", ".", "..") or any(c in name for c in ("/", "\\", "\0")):
        raise ConfigError(
            f"{source}: {name!r} is not a plain run name (the run directory is <outputs>/<run>); "
            "name the params file e.g. my-run.yaml"
        )
    return name


def upstream(notebook: str) -> dict[str, str]:
    """{input: the notebook that writes it} for each run file `notebook` reads (`INPUTS`, `PRODUCERS`)."""
    return {i: PRODUCERS[next(k for k in PRODUCERS if i == k or i.startswith(k + "/"))] for i in INPUTS[notebook]}


def git_state(repo: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    sha = git("rev-parse", "HEAD")
    return {"sha": sha or None, "dirty": bool(git("status", "--porcelain")) if sha else None}


def device_description() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version(),
                            "cpu_threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()}  # fmt: skip
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]

    info["cpu"] = cpu_info()
    dtype, why = auto_dtype(resolve_device("auto"))
    info["auto_dtype"] = {"dtype": str(dtype).removeprefix("torch."), "why": why}  # what `dtype: auto` means here
    return info


def versions() -> dict[str, str | None]:
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


@dataclass
class RunDir:
    root: Path
    lock: Any = field(default=None, repr=False, compare=False)  # the open lock file while a runner holds it

    @classmethod
    def create(cls, root: str | Path, mode: str = "new", replace: Iterable[str] | None = None) -> RunDir:
        """A run directory for a pipeline run, locked against a second runner until `release()`.

        mode: "new", "resume" or "overwrite" (with `replace`, globs relative to the run, only those are deleted); the
        rules are docs/runner.md#new-runs---overwrite-and---resume."""
        root = Path(root)
        if mode not in ("new", "resume", "overwrite"):
            raise ValueError(f"mode must be 'new', 'resume' or 'overwrite', got {mode!r}")
        check_run_name(root.name, str(root))
        root.mkdir(parents=True, exist_ok=True)
        run = cls(root)
        fresh_lock = not (root / LOCK_FILE).exists()
        run._acquire()
        try:
            run._refuse_a_live_runner()
            held = contents(root)
            if held and mode == "overwrite":
                real = run._real_root()  # a run directory that resolves elsewhere is refused first, whatever it holds
            if held and not (root / "manifest.json").is_file():
                raise FileExistsError(
                    f"{root} holds {listing(held)} but no run (no manifest.json): the runner neither writes into nor "
                    "deletes a folder it did not make; choose another run name (the params file's stem) or --outputs"
                )
            if held and mode == "new":
                raise FileExistsError(
                    f"{root} already holds a run ({listing(held)}); resume it (--resume), overwrite it deliberately "
                    "(--overwrite), or choose another run name"
                )
            if held and mode == "overwrite":
                nested = [p.name for p in root.iterdir() if (p / "manifest.json").is_file()]
                if nested:
                    raise FileExistsError(f"{root} holds other runs ({nested}), not a run of its own: not deleted")
                doomed = [p for p in root.iterdir() if p.name != LOCK_FILE] if replace is None else [
                    p for pattern in replace for p in sorted(root.glob(pattern))]  # fmt: skip
                for path in doomed:
                    _delete_inside(path, real)
            for sub in RUN_FOLDERS:
                (root / sub).mkdir(parents=True, exist_ok=True)
        except BaseException:
            run.release()
            if fresh_lock and contents(root):  # a folder that is not ours keeps no trace of the refusal
                (root / LOCK_FILE).unlink(missing_ok=True)
            raise
        return run

    def _real_root(self) -> Path:
        """The run directory resolved, refused unless it is really `<outputs>/<run>` (no symlink out)."""
        outputs = self.root.parent.resolve()
        real = self.root.resolve()
        if self.root.is_symlink() or real != outputs / self.root.name:
            raise FileExistsError(
                f"{self.root} resolves to {real}, outside {outputs}: --overwrite deletes only inside a run "
                "directory that really lies in the outputs folder; remove it by hand if you mean to"
            )
        return real

    def _acquire(self) -> None:
        handle = open(self.root / LOCK_FILE, "a+")  # noqa: SIM115 (held open until release)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = (handle.read().strip().splitlines() or ["unknown"])[0]
            handle.close()
            raise RunInUse(
                f"run {self.root.name!r} ({self.root}) is in use by another pipeline runner (pid {holder}); "
                "wait for it to finish or stop it (its lock dies with it)"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n{LOCK_NOTE}\n")
        handle.flush()
        self.lock = handle

    def _refuse_a_live_runner(self) -> None:
        """Refuses a run whose manifest names a live runner on this host (its lock file was deleted)."""
        try:
            manifest = self.read_manifest()
        except (OSError, ValueError):  # CorruptFile is a ValueError: --overwrite may replace it
            return
        runner = manifest.get("runner") if manifest.get("status") == "running" else None
        if runner_alive(runner):
            raise RunInUse(
                f"run {self.root.name!r} ({self.root}) is in use by another pipeline runner (pid {runner['pid']}, "
                f"running since {manifest.get('started', '?')}), whose lock file {LOCK_FILE} was deleted; wait for it "
                "to finish or stop it"
            )

    def check_lock(self) -> None:
        """Takes a new lock if this runner's lock file was deleted; RunInUse if another runner took it meanwhile."""
        if self.lock is None:
            return
        try:
            path, held = os.stat(self.root / LOCK_FILE), os.fstat(self.lock.fileno())
            if (path.st_dev, path.st_ino) == (held.st_dev, held.st_ino):
                return
        except FileNotFoundError:
            pass
        self.release()
        try:
            self._acquire()
        except RunInUse as err:
            raise RunInUse(f"this runner's lock file {LOCK_FILE} was deleted while it ran, and {err}") from None

    def release(self) -> None:
        """Releases the runner's lock (closing the file drops the fcntl lock)."""
        if self.lock is not None:
            self.lock.close()
            self.lock = None

    @classmethod
    def open(cls, run: str, outputs_dir: str | Path) -> RunDir:
        """The run directory a notebook works in (created if a notebook runs on its own in JupyterLab)."""
        root = Path(outputs_dir) / check_run_name(run, "parameter 'run'")
        for sub in RUN_FOLDERS:
            (root / sub).mkdir(parents=True, exist_ok=True)
        return cls(root)

    # paths ------------------------------------------------------------------------------------------
    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def merged_dir(self) -> Path:
        return self.root / "merged"

    @property
    def search_index_dir(self) -> Path:
        return self.root / "search" / "index"

    def data_path(self, name: str) -> Path:
        return self.root / "data" / name

    def present(self, relative: str) -> bool:
        """Whether the run holds `relative`: a file, or a folder holding something (what `require` asks of an input)."""
        path = self.root / relative
        return path.exists() and not (path.is_dir() and not any(path.iterdir()))

    def made(self, notebook: str) -> list[str]:
        """The run files `notebook` writes for later notebooks (`PRODUCERS`) that the run holds now."""
        return [relative for relative, producer in PRODUCERS.items() if producer == notebook and self.present(relative)]

    def require(self, relative: str) -> Path:
        path = self.root / relative
        if not self.present(relative):
            key = next((k for k in PRODUCERS if relative.startswith(k)), None)
            producer = PRODUCERS.get(key, "an earlier notebook")
            raise MissingInput(f"{path} is missing: run {producer} for run {self.root.name!r} first")
        return path

    def checkpoints(self) -> list[Path]:
        """Training checkpoints in step order."""
        self.require("checkpoints")
        found = sorted(p for p in self.checkpoints_dir.iterdir() if p.is_dir() and p.name.startswith("step-"))
        if not found:
            raise MissingInput(f"{self.checkpoints_dir} holds no step-* checkpoint: run 02_train_lora_contrastive")
        return found

    # writing ----------------------------------------------------------------------------------------
    def write_params(self, given: dict[str, Any], resolved: dict[str, Any]) -> None:
        (self.root / "params.yaml").write_text(yaml.safe_dump(given, sort_keys=True))
        (self.root / "resolved.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))

    def read_manifest(self) -> dict[str, Any]:
        path = self.root / "manifest.json"
        return load_json(path, "run manifest") if path.is_file() else {}

    def write_manifest(self, repo: Path, drop: Iterable[str] = (), **extra: Any) -> dict[str, Any]:
        """Updates manifest.json atomically with `extra`, the git state, versions and device, less `drop`."""
        manifest = self.read_manifest()
        manifest.setdefault("started", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        manifest.update(git=git_state(repo), versions=versions(), device=device_description(), **extra)
        if self.lock is not None:  # the runner working in the run, should its lock file be deleted
            manifest["runner"] = {"pid": os.getpid(), "start": process_start(os.getpid()), "host": platform.node()}
        for key in drop:
            manifest.pop(key, None)
        self.save_json("manifest.json", manifest, indent=2)
        return manifest

    def input_fingerprints(self, notebook: str) -> dict[str, str]:
        """{input: fingerprint} of what `notebook` reads from this run (`INPUTS`)."""
        return {relative: fingerprint(self.root / relative, relative) for relative in INPUTS[notebook]}

    def remove_products(self, notebook: str) -> list[str]:
        """Deletes what `notebook` wrote earlier (`PRODUCTS` less `KEPT_ON_RERUN`); returns it, run-relative."""
        real = self.root.resolve()
        kept = KEPT_ON_RERUN.get(notebook, ())
        doomed = [p for pattern in PRODUCTS[notebook] if pattern not in kept for p in sorted(self.root.glob(pattern))]
        for path in doomed:
            _delete_inside(path, real)
        return [p.relative_to(self.root).as_posix() for p in doomed]

    def save_metrics(self, name: str, values: Any) -> Path:
        return self.save_json(f"metrics/{name}.json", values, indent=2)

    def inside(self, relative: str | Path) -> Path:
        """`root/relative`, refused (ValueError) when it would lie outside the run directory."""
        path = self.root / relative
        if not path.resolve().is_relative_to(self.root.resolve()) or Path(relative).is_absolute():
            raise ValueError(f"{relative}: not a path inside the run directory {self.root}")
        return path

    def write_text(self, relative: str | Path, text: str) -> Path:
        """`text` at `relative` under the run, written whole or not at all (`files.replace_text`)."""
        path = self.inside(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_text(path, text)
        return path

    def save_json(self, relative: str | Path, values: Any, indent: int = 1) -> Path:
        """A JSON record at `relative` under the run, written atomically."""
        return self.write_text(relative, json.dumps(values, indent=indent, default=str) + "\n")

    def save_rows(self, relative: str | Path, table) -> Path:
        """A `datasets` table saved atomically at `relative` under the run, unless one is there (keyed by content)."""
        path = self.inside(relative)
        if path.is_dir():
            return path
        staging = path.with_name(f".{path.name}.staging")  # a fixed name: a killed save's copy is replaced next time
        if staging.exists():
            shutil.rmtree(staging)
        table.save_to_disk(str(staging))
        os.replace(staging, path)
        return path

    def load_metrics(self, name: str) -> Any:
        return json.loads(self.require(f"metrics/{name}.json").read_text())

    def save_text(self, name: str, text: str) -> Path:
        """A text product under metrics/ (e.g. metrics/results.md, the table the pipeline prints)."""
        return self.write_text(Path("metrics") / name, text)

    def save_figure(self, name: str, figure) -> Path:
        path = self.inside(Path("figures") / f"{name}.png")
        figure.savefig(path, dpi=120, bbox_inches="tight")
        return path

    def save_html(self, name: str, html: str) -> Path:
        return self.write_text(Path("figures") / f"{name}.html", html)

    def save_notebook_html(self, notebook: str, html: str) -> Path:
        """notebooks/<notebook>.html: an executed notebook as a page, beside its .ipynb."""
        return self.write_text(Path("notebooks") / f"{notebook}.html", html)

    def save_search_index(self, files: dict[str, bytes]) -> Path:
        """search/index/: the index's files, replacing the old index whole and atomically."""
        with atomic_directory(self.search_index_dir) as staging:
            for name, data in files.items():
                if not name or Path(name).name != name:
                    raise ValueError(f"save_search_index: {name!r} is not a plain file name")
                (staging / name).write_bytes(data)
        return self.search_index_dir

    def save_dataset(self, name: str, table) -> Path:
        path = self.data_path(name)
        if path.exists():
            shutil.rmtree(path)
        table.save_to_disk(str(path))
        return path

    def drop_dataset(self, name: str) -> bool:
        """Deletes data/<name> if it is there; returns whether it was."""
        path = self.data_path(name)
        if not path.exists() and not path.is_symlink():
            return False
        _delete_inside(path, self.root.resolve())
        return True

    def load_dataset(self, name: str):
        from datasets import load_from_disk

        return load_from_disk(str(self.require(f"data/{name}")))

    def optional_dataset(self, name: str):
        """data/<name> as a Dataset, or None when the run has none (data/heldout of an offline or hub run)."""
        path = self.data_path(name)
        return self.load_dataset(name) if path.exists() or path.is_symlink() else None
