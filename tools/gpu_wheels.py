"""`make gpu-wheels`: the wheels `make gpu-check` needs beyond the GPU machine's image, for its Python (CPython 3.12)
and platform (x86-64 manylinux), downloaded here into `.gpu-wheels/` (ignored by git) to travel with the working tree;
and `make gpu-wheels-rehearsal`, their rehearsal in a clean environment of the image's packages.

    python tools/gpu_wheels.py download [--dest .gpu-wheels]   # pip download --no-deps of the pins, then check
    python tools/gpu_wheels.py check [--dest .gpu-wheels]      # the folder against the lists
    python tools/gpu_wheels.py rehearse [--dest .gpu-wheels] [--python python3.12] [--venv DIR] [--record FILE]

Two lists: `tools/gpu-wheels.txt` (what is carried, pinned, with why) and `tools/gpu-image.txt` (the image's packages,
from the workplace's KINDS.md, with versions where known). `check` fails loudly, naming each problem, unless:

- the folder holds exactly one wheel per pin, at its version, and nothing else (two versions stop the install);
- no pin is a package the image has (a carried copy would shadow the image's on the path);
- the wheels fit: at most 60 MiB, and with the repository's tracked files at most 62 MiB (a device call carries at
  most 64 MiB of working tree, the wheels included; 2 MiB left for what the repository gains meanwhile);
- every Requires-Dist of every carried wheel that applies to CPython 3.12 on x86-64 Linux (extras followed where a
  requirement asks for them) is met by a carried wheel or by the image at a version its specifier allows (where the
  image list records the version; otherwise the name alone is checked, and the report says so), or is named in
  `LEFT_OUT` with why it is not needed at run time.

The modules the check imports (`check_modules`: every third-party import of the library, notebooks 01-05, the check and
the preflight it runs, encode_bench and the GPU tests) must each come from the image or a pin, or be named in
`NOT_NEEDED`: tests/test_gpu_wheels.py asserts it on every `make test`, so a new import cannot break the check unseen.

`rehearse` builds a clean virtual environment with Python 3.12 holding only image packages (`IMAGE_ROOTS` and what pip
resolves for them, each checked to be in the image list; PyPI's CUDA build of torch stands in for the image's, and runs
on a CPU), installs the folder exactly as the GPU machine will (`gpu_check.py --wheels`: `pip install --no-index
--no-deps --target`), imports every module of `check_modules`, and runs `gpu_check.py --size tiny` there with
notebooks 01-05 of the smoke run. `--record` writes what it found (sizes, versions, seconds, each part) as markdown.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import subprocess
import sys
import time
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
WHEELS_LIST = REPO / "tools" / "gpu-wheels.txt"
IMAGE_LIST = REPO / "tools" / "gpu-image.txt"
DEST = REPO / ".gpu-wheels"
MIB = 2**20
MAX_MIB = 60  # the wheels alone
TREE_MIB = 62  # the wheels and the repository's tracked files: a device call carries 64 MiB of working tree
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_26_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)
TARGET = {
    **default_environment(),
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
# TARGET: the GPU machine's interpreter, for the wheels' markers
LEFT_OUT = {  # needs of carried wheels that the check does without at run time
    "debugpy": "ipykernel's debugger (5.4 MiB): a papermill kernel is never debugged, and ipykernel starts without "
    "it (its import is optional); the rehearsal runs the notebooks without it",
    "jedi": "IPython's tab completion (4.7 MiB, with parso): IPython imports it only where installed, and a papermill "
    "kernel never completes; without it the wheels fit beside the repository in a device call",
}
NOT_NEEDED = {  # modules the library imports that no part of the check reaches
    "ipywidgets": "notebook 07's search widgets (search/searcher.py); the check runs notebooks 01-05",
}
IMAGE_ROOTS = (
    "torch",
    "transformers",
    "sentence-transformers",
    "accelerate",
    "tokenizers",
    "safetensors",
    "numpy",
    "huggingface-hub",
    "peft",
    "pandas",
    "pyarrow",
    "matplotlib",
    "seaborn",
    "scikit-learn",
    "scipy",
    "tqdm",
    "pytest",
    "pytest-timeout",
    "pytest-xdist",
    "pyyaml",
    "pathspec",
    "rich",
    "jinja2",
    "markupsafe",
    "requests",
    "httpx",
    "fsspec",
    "filelock",
    "xxhash",
    "psutil",
    "packaging",
    "pygments",
    "attrs",
    "click",
    "typing-extensions",
    "python-dateutil",
    "aiohttp",
    "regex",
)


# Where PyPI's newest release needs what the image's list lacks, the rehearsal takes the release before it: the image
# holds neither pydantic nor tzdata, so its typer (needed by transformers) predates 0.29 and its dateutil 4.0.
REHEARSAL_CONSTRAINTS = ("typer<0.29", "python-dateutil<3")


# the lists -----------------------------------------------------------------------------------------------------------
def read_list(path: Path) -> dict[str, str | None]:
    """{canonical name: version or None} of a list of `name==version` or `name` lines (comments after #)."""
    out: dict[str, str | None] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        key = canonicalize_name(name.strip())
        if key in out:
            raise SystemExit(f"{path.name}:{number}: {name.strip()} is listed twice")
        out[key] = version.strip() or None
    return out


def requirement_problems(
    requires: dict[str, list[str]],
    pins: dict[str, str | None],
    image: dict[str, str | None],
    target: dict[str, str] = TARGET,
) -> tuple[list[str], list[str]]:
    """(problems, notes) of the carried distributions' needs: `requires` maps each carried name to its Requires-Dist
    lines. A need is met by a pin whose version the specifier allows (its extras followed), by the image (its version
    checked where recorded), or by `LEFT_OUT`."""
    problems, notes, seen = [], [], set()
    todo = [(name, "") for name in requires]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        for line in requires.get(name, []):
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({**target, "extra": extra}):
                continue
            if extra and (req.marker is None or "extra" not in str(req.marker)):
                continue  # asked for an extra: only the extra's own lines are new
            need, why = canonicalize_name(req.name), f"{name}{f'[{extra}]' if extra else ''} needs {req}"
            if need in LEFT_OUT:
                notes.append(f"{why}: left out ({LEFT_OUT[need].split(':')[0]})")
            elif need in pins:
                if not req.specifier.contains(pins[need], prereleases=True):
                    problems.append(f"{why}, and {need} {pins[need]} is carried")
                todo += [(need, e) for e in req.extras]
            elif need in image:
                version = image[need]
                if version is None:
                    notes.append(f"{why}: in the image, version not recorded")
                elif not req.specifier.contains(version, prereleases=True):
                    problems.append(f"{why}, and the image has {need} {version}")
                if req.extras:
                    notes.append(f"{why}: the image's {need} extras {sorted(req.extras)} are not checked")
            else:
                problems.append(f"{why}, which is neither carried nor in the image")
    return problems, sorted(set(notes))


# the folder ----------------------------------------------------------------------------------------------------------
def wheel_requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(z.read(name).decode()).get_all("Requires-Dist") or []


def tree_bytes() -> int:
    """The repository's tracked files (what a device call carries besides the wheels)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    return sum((REPO / n.decode()).stat().st_size for n in names if n and (REPO / n.decode()).is_file())


def check(dest: Path) -> dict[str, Any]:
    """Every rule of the module docstring on the folder; SystemExit naming each problem."""
    pins, image = read_list(WHEELS_LIST), read_list(IMAGE_LIST)
    problems = [
        f"{name} is carried, but the image has it: drop it from {WHEELS_LIST.name}" for name in pins if name in image
    ]
    found: dict[str, Path] = {}
    for wheel in sorted(dest.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        key = canonicalize_name(name)
        if key not in pins or Version(pins[key]) != version:
            problems.append(f"{wheel.name} is not in {WHEELS_LIST.name} (remove it: two versions stop the install)")
        elif key in found:
            problems.append(f"{key} twice: {found[key].name} and {wheel.name}")
        else:
            found[key] = wheel
    problems += [f"{name}=={pins[name]} was not downloaded" for name in pins if name not in found]
    size, tree = sum(w.stat().st_size for w in found.values()), tree_bytes()
    if size > MAX_MIB * MIB:
        problems.append(f"the wheels take {size / MIB:.1f} MiB, more than {MAX_MIB} MiB")
    if size + tree > TREE_MIB * MIB:
        problems.append(
            f"the wheels ({size / MIB:.1f} MiB) and the repository ({tree / MIB:.1f} MiB) take more than "
            f"{TREE_MIB} MiB: a device call carries at most 64 MiB of working tree"
        )
    needs, notes = requirement_problems({k: wheel_requires(w) for k, w in found.items()}, pins, image)
    problems += needs
    if problems:
        raise SystemExit("gpu wheels: " + str(len(problems)) + " problem(s):\n- " + "\n- ".join(problems))
    return {
        "wheels": len(found),
        "mib": size / MIB,
        "tree_mib": tree / MIB,
        "notes": notes,
        "largest": sorted(((w.stat().st_size / MIB, w.name) for w in found.values()), reverse=True)[:5],
    }


def download(dest: Path) -> dict[str, Any]:
    """pip download --no-deps of every pin for CPython 3.12 on x86-64 manylinux; strays removed; then `check`."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = read_list(WHEELS_LIST)
    for wheel in dest.glob("*.whl"):  # an earlier list's wheels
        name, version, _, _ = parse_wheel_filename(wheel.name)
        if pins.get(canonicalize_name(name)) is None or Version(pins[canonicalize_name(name)]) != version:
            wheel.unlink()
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        *platforms,
        "-d",
        str(dest),
        *(f"{n}=={v}" for n, v in pins.items()),
    ]
    subprocess.run(cmd, check=True)
    return check(dest)


# the modules the check imports ----------------------------------------------------------------------------------------
def _imports(source: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def check_modules() -> list[str]:
    """Every third-party module the check can import: the library (function-level imports too), notebooks 01-05,
    tools/gpu_*.py, the preflight and scale formulas it runs (tools/preflight/, tools/scale.py),
    benchmarks/encode_bench.py, tests/test_gpu.py, its conftest and the FLOP tests it borrows from."""
    found: set[str] = set()
    files = [
        *REPO.joinpath("c2llm_lib").rglob("*.py"),
        *REPO.joinpath("tools").glob("gpu_*.py"),
        *REPO.joinpath("tools", "preflight").glob("*.py"),
        REPO / "tools" / "scale.py",
        REPO / "benchmarks" / "encode_bench.py",
        REPO / "tests" / "test_gpu.py",
        REPO / "tests" / "conftest.py",
        REPO / "tests" / "test_flops.py",
    ]
    for path in files:
        found |= _imports(path.read_text())
    for notebook in sorted(REPO.joinpath("notebooks").glob("0[1-5]_*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            if cell["cell_type"] == "code":
                lines = "".join(cell["source"]).splitlines()
                found |= _imports("\n".join(x for x in lines if not x.lstrip().startswith(("%", "!"))))
    local = {"c2llm_lib", "tools", "conftest", "test_flops", "gpu_parts", "gpu_check", "gpu_wheels"}
    return sorted(m for m in found if m not in sys.stdlib_module_names and m not in local and not m.startswith("_"))


# the rehearsal -------------------------------------------------------------------------------------------------------
def run(cmd: list[str], log: list[str], **kw) -> subprocess.CompletedProcess:
    tick = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    log.append(
        f"{' '.join(cmd[:6])}{' ...' if len(cmd) > 6 else ''}: exit {done.returncode}, {time.monotonic() - tick:.0f} s"
    )
    if done.returncode:
        raise SystemExit(f"{cmd[:6]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def rehearse(dest: Path, python: str, venv: Path, record: Path | None) -> dict[str, Any]:
    """The module docstring's rehearsal; what it found, also written to `record` as markdown."""
    log: list[str] = []
    start = time.monotonic()
    folder = check(dest)
    image = read_list(IMAGE_LIST)
    py = venv / "bin" / "python"
    marker = venv / ".image-installed.json"  # the image's packages (gigabytes: kept between rehearsals)
    if not marker.is_file():
        tick = time.monotonic()
        run([python, "-m", "venv", "--clear", str(venv)], log)
        roots = [f"{n}=={image[canonicalize_name(n)]}" if image.get(canonicalize_name(n)) else n for n in IMAGE_ROOTS]
        run([str(py), "-m", "pip", "install", "-q", *roots, *REHEARSAL_CONSTRAINTS], log)
        marker.write_text(json.dumps({"roots": roots, "seconds": time.monotonic() - tick, "date": time.ctime()}))
    built = json.loads(marker.read_text())
    listed = json.loads(run([str(py), "-m", "pip", "list", "--format=json"], log).stdout)
    installed = {canonicalize_name(d["name"]): d["version"] for d in listed}
    outside = sorted(n for n in installed if n not in image)
    if outside:
        raise SystemExit(f"the clean environment holds packages the image lacks: {outside}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    site = Path("/tmp/c2llm-gpu-rehearsal-site")
    tick = time.monotonic()
    run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--upgrade",
            "--target",
            str(site),
            *map(str, sorted(dest.glob("*.whl"))),
        ],
        log,
        env=env,
    )
    install_s = time.monotonic() - tick
    modules = check_modules()
    missing = [m for m in modules if m in NOT_NEEDED]
    code = f"import importlib\nfor m in {[m for m in modules if m not in missing]!r}: importlib.import_module(m)\n"
    code += "import c2llm_lib.pipeline, c2llm_lib.eval, c2llm_lib.eval.mteb, c2llm_lib.data.build, tools.preflight"
    run([str(py), "-c", code], log, env={**env, "PYTHONPATH": f"{site}:{REPO}"})
    out = Path("/tmp/c2llm-gpu-rehearsal-out")
    tick = time.monotonic()
    checked = subprocess.run(
        [
            str(py),
            str(REPO / "tools" / "gpu_check.py"),
            "--out",
            str(out),
            "--size",
            "tiny",
            "--wheels",
            str(dest),
            "--notebooks",
            "01",
            "02",
            "03",
            "04",
            "05",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    check_s = time.monotonic() - tick
    report = json.loads((out / "gpu_check.json").read_text()) if (out / "gpu_check.json").is_file() else {}
    found = {
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "python": run([str(py), "-V"], log).stdout.strip(),
        "folder": folder,
        "image_packages": len(installed),
        "image_versions": {
            k: installed.get(k)
            for k in ("torch", "transformers", "sentence-transformers", "numpy", "peft", "pandas", "pyarrow")
        },
        "image_install_s": built["seconds"],
        "image_built": built["date"],
        "wheel_install_s": install_s,
        "modules": modules,
        "not_needed": missing,
        "check_exit": checked.returncode,
        "check_s": check_s,
        "parts": report.get("parts", {}),
        "wheels_step": report.get("wheels", {}),
        "seconds": time.monotonic() - start,
        "log": log,
        "commit": report.get("commit"),
        "passed": checked.returncode == 0,
    }
    if record is not None:
        record.write_text(markdown(found))
    if checked.returncode:
        raise SystemExit(f"the check failed in the rehearsal (exit {checked.returncode}):\n{checked.stdout[-3000:]}")
    return found


def machine() -> str:
    """This machine in words: its CPU model (Linux's /proc/cpuinfo), cores and memory."""
    model = platform.processor() or platform.machine()
    try:
        info = Path("/proc/cpuinfo").read_text()
        model = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        memory = next(
            int(x.split()[1]) for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal")
        )
        return f"{model}, {os.cpu_count()} CPUs, {memory / 2**20:.0f} GiB, {platform.system()} {platform.release()}"
    except (OSError, StopIteration, ValueError):
        return f"{model}, {os.cpu_count()} CPUs"


def markdown(found: dict[str, Any]) -> str:
    folder, parts = found["folder"], found["parts"]
    versions = ", ".join(f"{k} {v}" for k, v in found["image_versions"].items())
    lines = [
        "# The GPU machine's wheels, rehearsed on a CPU",
        "",
        f"{found['date']}, {found['machine']}, commit {found['commit']}: `make gpu-wheels-rehearsal` "
        f"(`python tools/gpu_wheels.py rehearse --record benchmarks/results/gpu-wheels.md`). "
        f"**{'Passed' if found['passed'] else 'Failed'}** in {found['seconds']:.0f} s.",
        "",
        f"- **The folder** (`make gpu-wheels`, `.gpu-wheels/`): {folder['wheels']} wheels, **{folder['mib']:.1f} MiB** "
        f"(limit {MAX_MIB} MiB), {folder['mib'] + folder['tree_mib']:.1f} MiB with the repository's tracked files "
        f"(limit {TREE_MIB} of a device call's 64 MiB); largest: "
        + ", ".join(f"{name} {mib:.1f} MiB" for mib, name in folder["largest"])
        + ".",
        f"- **The clean environment**: {found['python']}, {found['image_packages']} packages, every one in the "
        f"image's list (`tools/gpu-image.txt`); {versions} (PyPI's CUDA build of torch standing in for the image's, on "
        f"a CPU); installed in {found['image_install_s']:.0f} s ({found['image_built']}; kept between rehearsals).",
        f"- **The folder installed** with `pip install --no-index --no-deps --target` in "
        f"{found['wheel_install_s']:.0f} s; the {len(found['modules']) - len(found['not_needed'])} third-party modules "
        f"the check imports, "
        f"imported ({', '.join(m for m in found['modules'] if m not in found['not_needed'])}; not needed by the "
        f"check: {', '.join(found['not_needed']) or 'none'}).",
        f"- **`gpu_check.py --size tiny --wheels .gpu-wheels`** there, smoke notebooks 01-05: exit "
        f"{found['check_exit']} in {found['check_s']:.0f} s (its own install of the wheels: "
        f"{found['wheels_step'].get('status')}, {found['wheels_step'].get('seconds', 0):.0f} s).",
        "",
        "| part | status | seconds |",
        "|---|---|---|",
    ]
    lines += [f"| {n} | {p['status']} | {p['seconds']:.0f} |" for n, p in parts.items()]
    lines += ["", "Needs the check left as notes (met by name; the image list records no version):", ""]
    lines += [f"- {note}" for note in folder["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["download", "check", "rehearse"])
    parser.add_argument("--dest", type=Path, default=DEST)
    parser.add_argument("--python", default="python3.12", help="a Python 3.12 for the rehearsal's environment")
    parser.add_argument("--venv", type=Path, default=Path("/tmp/c2llm-gpu-rehearsal-venv"))
    parser.add_argument("--record", type=Path, default=None, help="write the rehearsal's findings here (markdown)")
    args = parser.parse_args(argv)
    if args.action == "download":
        found = download(args.dest)
    elif args.action == "check":
        found = check(args.dest)
    else:
        found = rehearse(args.dest, args.python, args.venv, args.record)
    print(json.dumps({k: v for k, v in found.items() if k not in ("log", "notes")}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
