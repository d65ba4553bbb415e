"""A local mirror of every hub dataset the shipped recipes read, laid out as the hub repositories are at the pinned
revisions (`c2llm_lib.data.mirror`): the 12 training sources and the MTEB(Code, v1) test data as mteb loads them.

What it reproduces of the real datasets, because each of these changed a result once:
- CoIR sets keep one corpus for all splits: a task's test split is scored against the whole corpus, train and valid
  documents included (AppsRetrieval: 8,765 documents for 3,765 test queries), and qrels have train/valid/test splits.
- CoIR's multi-language sets (CodeSearchNet, CodeSearchNet-ccr) have `<lang>-corpus/queries/qrels` configs and a
  `partition` column on the queries; mteb's CodeSearchNetRetrieval reads its own `mteb/CodeSearchNetRetrieval`.
- CodeEditSearch is one table per language, and mteb evaluates the first 1,000 rows of its *train* split, the split
  that trains: only rows past the first 1,000 can train (one language here has a few).
- Planted overlaps: in every CoIR set, one training query is also a test query, and one training positive is a
  document a test qrel marks relevant. Decontamination must drop exactly those rows and keep the rest.
The texts are small made-up code and questions; the scores on them mean nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from c2llm_lib.data.mirror import repo_dir, write_dataset_card
from c2llm_lib.data.sources import CODE_EDIT_LANGUAGES, CSN_LANGUAGES, SOURCES

TRAIN, VALID, TEST = 10, 2, 6  # pairs per (set, language) and split
CODE_EDIT_EVALUATED = 1000  # mteb's CodeEditSearchRetrieval evaluates the first 1,000 rows per language
CODE_EDIT_EXTRA = 4  # rows past those, in the first language only: the only CodeEditSearch rows that may train
VERBS = ("parse", "sort", "merge", "count", "filter", "render", "encode", "load", "split", "hash")
NOUNS = ("records", "tokens", "intervals", "words", "edges", "pixels", "headers", "rows", "paths", "events")


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


CODE_QUERIES = {"CoIR-Retrieval/CodeSearchNet": "code->text", "CoIR-Retrieval/CodeSearchNet-ccr": "code->code"}


def pair(hub_id: str, language: str, i: int) -> tuple[str, str]:
    """A (query, document) pair, distinct per set, language and index: text -> code by default; code -> docstring
    for CoIR's CodeSearchNet, first half -> rest of a function for CodeSearchNet-ccr."""
    verb, noun = VERBS[i % len(VERBS)], NOUNS[(i // len(VERBS) + len(hub_id) + len(language)) % len(NOUNS)]
    question = f"{verb} the {noun} of item {i} ({hub_id}, {language})"
    head = f"def {verb}_{noun}_{i}(xs):\n    # {hub_id} {language}"
    tail = f"    return [x for x in xs if x != {i}]"
    kind = CODE_QUERIES.get(hub_id, "text->code")
    if kind == "code->text":
        return f"{head}\n{tail}", question
    if kind == "code->code":
        return head, tail
    return question, f"{head}\n{tail}"


def coir_set(repo: Path, prefix: str, hub_id: str, language: str, multilang: bool) -> None:
    """One CoIR (sub)set: a corpus holding every split's documents, queries, and qrels per split, with the
    planted overlaps (training query 0 = test query 0; training positive 1 = test document 1)."""
    splits = {"train": TRAIN, "valid": VALID, "test": TEST}
    corpus, queries, qrels = [], [], {s: [] for s in splits}
    for split, n in splits.items():
        for i in range(n):
            query, document = pair(hub_id, language, i + {"train": 0, "valid": 100, "test": 200}[split])
            qid, did = f"{split}-q{i}", f"{split}-d{i}"
            queries.append({"_id": qid, "text": query, **({"partition": split} if multilang else {})})
            corpus.append({"_id": did, "title": "", "text": document})
            qrels[split].append({"query-id": qid, "corpus-id": did, "score": 1})
    by_id = {q["_id"]: q for q in queries}
    by_id["train-q0"]["text"] = by_id["test-q0"]["text"]  # a training query that is also a test query
    qrels["train"][1]["corpus-id"] = "test-d1"  # a training positive that is a relevant test document
    write(repo / f"{prefix}corpus" / "corpus.jsonl", corpus)
    write(repo / f"{prefix}queries" / "queries.jsonl", queries)
    for split, rows in qrels.items():
        write(repo / (f"{prefix}qrels" if multilang else "default") / f"{split}.jsonl", rows)


def code_edit_search(repo: Path) -> None:
    for n, language in enumerate(CODE_EDIT_LANGUAGES):
        rows = 10 if n else CODE_EDIT_EVALUATED + CODE_EDIT_EXTRA
        write(repo / language / "train.jsonl", [
            {"commit": f"{language}-{i:05d}", "instruction": f"fix the bounds check in loop {i} ({language})",
             "diff": f"- for i in range({i} + 1):\n+ for i in range({i}):  # {language}"}
            for i in range(rows)
        ])  # fmt: skip


def mteb_code_search_net(repo: Path, coir_csn: Path) -> None:
    """mteb/CodeSearchNetRetrieval: docstring -> code, the test pairs of CoIR's CodeSearchNet read the other way."""
    for language in CSN_LANGUAGES:
        source_queries = [json.loads(line) for line in (coir_csn / f"{language}-queries" / "queries.jsonl").open()]
        source_corpus = [json.loads(line) for line in (coir_csn / f"{language}-corpus" / "corpus.jsonl").open()]
        tests = [json.loads(line) for line in (coir_csn / f"{language}-qrels" / "test.jsonl").open()]
        queries = {q["_id"]: q["text"] for q in source_queries}
        corpus = {d["_id"]: d["text"] for d in source_corpus}
        # CoIR's CodeSearchNet queries are code and documents docstrings; mteb's task asks with the docstring
        write(repo / f"{language}-queries" / "test.jsonl", [{"_id": r["corpus-id"], "text": corpus[r["corpus-id"]]}
                                                           for r in tests])  # fmt: skip
        documents = [{"_id": q, "title": "", "text": t} for q, t in queries.items()]
        write(repo / f"{language}-corpus" / "test.jsonl", documents)
        write(repo / f"{language}-qrels" / "test.jsonl", [{"query-id": r["corpus-id"], "corpus-id": r["query-id"],
                                                          "score": 1} for r in tests])  # fmt: skip


def write_mirror(root: Path) -> Path:
    """Writes the whole mirror under `root` and returns it."""
    for source in SOURCES.values():
        repo = repo_dir(root, source.hub_id)
        if repo.exists():  # CodeSearchNet serves two sources
            continue
        if source.layout == "pairs":
            code_edit_search(repo)
            continue  # read by data_dir, as mteb reads it: no config card
        for language in source.languages:
            multilang = source.layout == "coir_multilang"
            coir_set(repo, f"{language}-" if multilang else "", source.hub_id, language, multilang)
        write_dataset_card(repo)
    csn = repo_dir(root, "mteb/CodeSearchNetRetrieval")
    mteb_code_search_net(csn, repo_dir(root, SOURCES["COIRCodeSearchNetRetrieval"].hub_id))
    write_dataset_card(csn)
    return root
