"""Hand-made samples in each hub source's real schema, laid out as `iter_records(local_root=...)` reads
them: `<root>/<hub id, / as __>/<config or language>/<split>.jsonl`. Every source gets two good pairs
per subset; some get planted problems (an empty text, a duplicate, a qrel to a missing document)."""

import json
from pathlib import Path

from c2llm_lib.data.sources import SOURCES

CODE = {
    "python": ("def area(r):\n    return 3.14159 * r * r", "def greet(name):\n    return 'hi ' + name"),
    "go": ("func Add(a, b int) int {\n\treturn a + b\n}", "func Neg(x int) int {\n\treturn -x\n}"),
    "java": ("int add(int a, int b) { return a + b; }", "String up(String s) { return s.toUpperCase(); }"),
    "javascript": ("function add(a, b) { return a + b; }", "const up = s => s.toUpperCase();"),
    "php": ("function add($a, $b) { return $a + $b; }", "function up($s) { return strtoupper($s); }"),
    "ruby": ("def add(a, b)\n  a + b\nend", "def up(s)\n  s.upcase\nend"),
    "sql": ("SELECT name FROM users WHERE age > 30;", "SELECT COUNT(*) FROM orders;"),
    "mixed": ("Use a dict comprehension: `{k: v for k, v in pairs}`.", "Call `list.sort(key=len)` to sort by length."),
    "c++": ("int add(int a, int b) { return a + b; }", "std::string up(std::string s);"),
}
TEXT = ("compute the area of a circle", "say hello to someone by name")


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def coir_subset(root: Path, prefix: str, language: str, multilang: bool, planted: bool) -> None:
    code = CODE.get(language, CODE["python"])
    corpus = [{"_id": f"d{i}", "title": "", "text": code[i]} for i in range(2)]
    queries = [{"_id": f"q{i}", "text": TEXT[i]} for i in range(2)]
    qrels = [{"query-id": f"q{i}", "corpus-id": f"d{i}", "score": 1} for i in range(2)]
    qrels.append({"query-id": "q0", "corpus-id": "d1", "score": 0})  # not relevant: not a pair
    if planted:
        corpus.append({"_id": "d_empty", "title": "", "text": "   "})
        queries.append({"_id": "q_dup", "text": TEXT[0]})
        qrels += [
            {"query-id": "q0", "corpus-id": "d_empty", "score": 1},  # empty text
            {"query-id": "q_dup", "corpus-id": "d0", "score": 1},  # duplicate of (q0, d0)
            {"query-id": "q1", "corpus-id": "d_missing", "score": 1},
        ]  # missing document
    if multilang:
        for q in queries:
            q["partition"] = "train"
    write(root / f"{prefix}corpus" / "corpus.jsonl", corpus)
    write(root / f"{prefix}queries" / "queries.jsonl", queries)
    write(root / (f"{prefix}qrels" if multilang else "default") / "train.jsonl", qrels)


def write_fixtures(root: Path) -> Path:
    for source in SOURCES.values():
        base = root / source.hub_id.replace("/", "__")
        if source.layout == "pairs":
            for i, language in enumerate(source.languages):
                rows = [
                    {
                        "commit": f"c{language}{j}",
                        "instruction": f"fix bug {j} in {language} code",
                        "diff": f"- old line {j}\n+ new line {j} ({language})",
                        "lang": language,
                    }
                    for j in range(2)
                ]
                if i == 0:
                    rows.append({"commit": "cbad", "instruction": "", "diff": "+ x"})  # empty query
                write(base / language / "train.jsonl", rows)
        elif source.layout == "coir_multilang":
            for i, language in enumerate(source.languages):
                coir_subset(base, f"{language}-", language, True, planted=(i == 0))
        else:
            coir_subset(base, "", source.languages[0], False, planted=(source.name == "CosQA"))
    return root
