"""Run directories: `outputs/<run>/` holds everything a run produced, and only `RunDir` writes there.

Layout:
    params.yaml            the overrides as given (the params file and any --set)
    resolved.yaml          every parameter in effect, per notebook
    manifest.json          git SHA and dirty flag, library versions, device, start and end times
    notebooks/NN_*.ipynb   the executed notebooks
    data/                  prepared datasets (Arrow), e.g. data/train
    checkpoints/step-*/    training checkpoints (adapter + head + trainer state)
    merged/                the merged encoder (C2LLMEncoder.save_pretrained)
    metrics/*.json         numbers each stage reports
    figures/*.png          figures each stage draws

Notebooks talk to each other only through these paths. `require` names the notebook that produces a
missing input, so running notebook 03 before 02 says what to run instead of failing deep inside.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

PRODUCERS = {
    "data/train": "01_data_prep",
    "data/eval": "01_data_prep",
    "checkpoints": "02_train_lora_contrastive",
    "metrics/train.json": "02_train_lora_contrastive",
    "merged": "03_merge_checkpoints",
}
LIBRARIES = ("c2llm_lib", "torch", "transformers", "peft", "datasets", "accelerate", "mteb", "papermill", "bm25s")


class MissingInput(FileNotFoundError):
    """A stage's input is not in the run directory; the message names the notebook that writes it."""


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

    @classmethod
    def create(cls, root: str | Path, mode: str = "new") -> RunDir:
        """A run directory for a pipeline run. mode: "new" (refuses an existing non-empty run), "resume"
        (continues in it), or "overwrite" (deletes it first, deliberately)."""
        root = Path(root)
        if mode not in ("new", "resume", "overwrite"):
            raise ValueError(f"mode must be 'new', 'resume' or 'overwrite', got {mode!r}")
        exists = root.exists() and any(root.iterdir())
        if exists and mode == "new":
            raise FileExistsError(
                f"{root} already holds a run; resume it (--resume), overwrite it deliberately (--overwrite), "
                "or choose another run name"
            )
        if exists and mode == "overwrite":
            shutil.rmtree(root)
        for sub in ("notebooks", "data", "checkpoints", "metrics", "figures"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        return cls(root)

    @classmethod
    def open(cls, run: str, outputs_dir: str | Path) -> RunDir:
        """The run directory a notebook works in (created if a notebook runs on its own in JupyterLab)."""
        root = Path(outputs_dir) / run
        for sub in ("notebooks", "data", "checkpoints", "metrics", "figures"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        return cls(root)

    # paths ------------------------------------------------------------------------------------------
    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def merged_dir(self) -> Path:
        return self.root / "merged"

    def data_path(self, name: str) -> Path:
        return self.root / "data" / name

    def require(self, relative: str) -> Path:
        path = self.root / relative
        if not path.exists() or (path.is_dir() and not any(path.iterdir())):
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

    def write_manifest(self, repo: Path, **extra: Any) -> dict[str, Any]:
        path = self.root / "manifest.json"
        manifest = json.loads(path.read_text()) if path.is_file() else {}
        manifest.setdefault("started", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        manifest.update(git=git_state(repo), versions=versions(), device=device_description(), **extra)
        path.write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        return manifest

    def save_metrics(self, name: str, values: Any) -> Path:
        path = self.root / "metrics" / f"{name}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(values, indent=2, default=str) + "\n")
        os.replace(tmp, path)
        return path

    def load_metrics(self, name: str) -> Any:
        return json.loads(self.require(f"metrics/{name}.json").read_text())

    def save_text(self, name: str, text: str) -> Path:
        """A text product under metrics/ (e.g. metrics/results.md, the table the pipeline prints)."""
        path = self.root / "metrics" / name
        path.write_text(text)
        return path

    def save_figure(self, name: str, figure) -> Path:
        path = self.root / "figures" / f"{name}.png"
        figure.savefig(path, dpi=120, bbox_inches="tight")
        return path

    def save_html(self, name: str, html: str) -> Path:
        path = self.root / "figures" / f"{name}.html"
        path.write_text(html)
        return path

    def save_dataset(self, name: str, table) -> Path:
        path = self.data_path(name)
        if path.exists():
            shutil.rmtree(path)
        table.save_to_disk(str(path))
        return path

    def load_dataset(self, name: str):
        from datasets import load_from_disk

        return load_from_disk(str(self.require(f"data/{name}")))
