"""Mining pairs from local source trees (`data_source: code`): files/s, functions/s, pairs/s and peak memory.

Mines the given folders with `code_trees.mine` (every skip rule, tree-sitter parsing, documentation cleaning, the
pair recipes), discarding the records as they come, and writes the counts, the rates and the memory: the peak
resident memory of the process (VmHWM, imports included), the resident memory after the imports, and the resident
memory every 1,000 files, which stays flat when mining streams file by file. The default folders are this Python's
standard library and the virtualenv's site-packages: a real tree of well over 100,000 functions in one language;
`--root` mines others (any language of `grammars.GRAMMARS`).

Usage:
    python benchmarks/code_mining_bench.py                      # writes results/code-mining.{json,md}
    python benchmarks/code_mining_bench.py --root ~/src/repo    # another tree (repeat --root for several)
    python benchmarks/code_mining_bench.py --root tests/fixtures/own-code --limit 10 --out /tmp/bench  # a smoke test
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import sysconfig
import time
from importlib import metadata
from pathlib import Path

from c2llm_lib.data.code_trees import MiningReport, mine
from c2llm_lib.hardware import cpu_info, high_water_kib

RESULTS = Path(__file__).resolve().parent / "results"


def default_roots() -> list[Path]:
    """The standard library, and site-packages unless it lies inside it (a Python without a virtualenv)."""
    stdlib, packages = Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])
    return [stdlib] + ([packages] if not packages.resolve().is_relative_to(stdlib.resolve()) else [])


def resident_mib() -> float:
    """The resident memory of this process now (VmRSS), in MiB."""
    found = re.search(r"^VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    return int(found.group(1)) / 1024 if found else float("nan")


def measure(roots: list[Path], limit: int | None) -> dict:
    """Mines the roots (up to `limit` parsed files) and returns the counts, rates and memory."""
    report = MiningReport()
    records = texts = 0
    samples, next_sample = [], 1000
    start = time.perf_counter()
    for record in mine(roots, report=report):
        records += 1
        texts += len(record["query"]) + len(record["positive"])
        files = report.files.passed.total()
        if files >= next_sample:
            samples.append(round(resident_mib(), 1))
            next_sample += 1000
        if limit is not None and files >= limit:
            break
    seconds = time.perf_counter() - start
    files, functions = report.files.passed.total(), sum(report.functions.values())
    skipped = sum(sum(reasons.values()) for reasons in report.files.skipped.values())
    return {
        "roots": [str(r) for r in roots],
        "limit_files": limit,
        "seconds": round(seconds, 2),
        "files_mined": files,
        "files_or_folders_skipped": skipped,
        "functions": functions,
        "documented_functions": sum(report.documented.values()),
        "pairs": records,
        "pair_text_mb": round(texts / 1e6, 1),
        "files_per_s": round(files / seconds, 1),
        "functions_per_s": round(functions / seconds, 1),
        "pairs_per_s": round(records / seconds, 1),
        "rss_mib_every_1000_files": samples,
        "report": report.as_dict(),
    }


def markdown(result: dict) -> str:
    cpu = result["cpu"]
    skipped = {}
    for entry in result["report"]["files"].values():
        for reason, n in entry["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + n
    top = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items(), key=lambda kv: -kv[1])[:6])
    limit = f" (stopped after {result['limit_files']} files)" if result["limit_files"] else ""
    return (
        "# Mining pairs from local source trees (`data_source: code`)\n\n"
        f"Roots: {', '.join(f'`{r}`' for r in result['roots'])}{limit}.\n\n"
        "| measure | value |\n|---|---|\n"
        f"| files mined (parsed) | {result['files_mined']:,} |\n"
        f"| files or folders skipped | {result['files_or_folders_skipped']:,} ({top or 'none'}) |\n"
        f"| functions found, documented | {result['functions']:,}, {result['documented_functions']:,} |\n"
        f"| pairs (text->code and code->code) | {result['pairs']:,} ({result['pair_text_mb']} MB of text) |\n"
        f"| time | {result['seconds']} s |\n"
        f"| files/s, functions/s, pairs/s | {result['files_per_s']:,}, {result['functions_per_s']:,}, "
        f"{result['pairs_per_s']:,} |\n"
        f"| peak resident memory (imports included) | {result['peak_rss_mib']} MiB |\n"
        f"| resident memory after the imports | {result['rss_after_imports_mib']} MiB |\n"
        f"| resident memory every 1,000 files | {result['rss_mib_every_1000_files'] or 'fewer than 1,000 files'} |\n"
        f"| CPU | {cpu['model']}, {cpu['threads']} threads, {' '.join(cpu['capabilities']) or 'no listed flags'} |\n"
        f"| Python, tree-sitter | {result['python']}, {result['tree_sitter']} |\n\n"
        "One process, records discarded as they come. Reproduce: `python benchmarks/code_mining_bench.py`\n"
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", action="append", type=Path, help="a folder to mine (repeatable); default: the "
                        "standard library and site-packages")  # fmt: skip
    parser.add_argument("--limit", type=int, default=None, help="stop after this many parsed files (a smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where code-mining.json and .md go")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be at least 1, got {args.limit}")
    roots = args.root or default_roots()
    after_imports = resident_mib()
    result = measure(roots, args.limit)
    result.update(
        peak_rss_mib=round((high_water_kib() or 0) / 1024, 1),
        rss_after_imports_mib=round(after_imports, 1),
        cpu=cpu_info(),
        python=platform.python_version(),
        tree_sitter=metadata.version("tree-sitter"),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "code-mining.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (args.out / "code-mining.md").write_text(text)
    print(text)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
