"""The wheels `make gpu-wheels` carries to the GPU machine (tools/gpu-wheels.txt) against what `make gpu-check` imports
and against the image's packages (tools/gpu-image.txt), without a download: a new import or a new need that neither
the image nor the list covers fails here, not on the rare day a GPU machine is lent."""

import sys
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

import gpu_wheels  # noqa: E402

PINS = gpu_wheels.read_list(gpu_wheels.WHEELS_LIST)
IMAGE = gpu_wheels.read_list(gpu_wheels.IMAGE_LIST)


def test_every_module_the_check_imports_comes_from_the_image_or_the_wheels():
    modules = gpu_wheels.check_modules()
    assert {"papermill", "mteb", "datasets", "torch", "transformers", "tree_sitter"} <= set(modules)
    owners = metadata.packages_distributions()  # this environment: module -> the distributions that provide it
    uncovered = []
    for module in modules:
        dists = {canonicalize_name(d) for d in owners.get(module, [])}
        if module not in gpu_wheels.NOT_NEEDED and not dists & (set(PINS) | set(IMAGE)):
            uncovered.append(f"{module} ({', '.join(sorted(dists)) or 'no distribution found'})")
    assert uncovered == [], "carry these (tools/gpu-wheels.txt) or name them in NOT_NEEDED"


def test_the_carried_wheels_needs_are_met_by_the_wheels_or_the_image():
    # the Requires-Dist of each pin, read from this environment where it holds the pinned version (`make gpu-wheels`
    # checks every downloaded wheel's own metadata the same way)
    requires = {name: metadata.requires(name) or [] for name, version in PINS.items()
                if _installed(name) == version}  # fmt: skip
    assert len(requires) >= len(PINS) - 2  # polars 1.0.0 is carried where this environment has 2.1
    problems, _ = gpu_wheels.requirement_problems(requires, PINS, IMAGE)
    assert problems == []


def test_the_lists_pin_every_wheel_and_shadow_nothing_in_the_image():
    assert all(version for version in PINS.values())
    assert not set(PINS) & set(IMAGE)
    assert IMAGE["torch"] == "2.11.0" and IMAGE["python"] == "3.12.3" and "papermill" not in IMAGE
    assert set(gpu_wheels.LEFT_OUT) == {"debugpy", "jedi"} and not set(gpu_wheels.LEFT_OUT) & set(PINS)


def test_a_need_neither_carried_nor_in_the_image_is_named_and_versions_and_extras_are_checked():
    pins = {"a": "1.0", "b": "2.0"}
    image = {"numpy": "2.5.2", "fsspec": None}
    requires = {
        "a": ["b[css]>=2", "numpy<2", "fsspec", "missing>=1", 'windows-only; sys_platform == "win32"'],
        "b": ['tinycss2; extra == "css"', 'other; extra == "docs"', "debugpy"],
    }
    problems, notes = gpu_wheels.requirement_problems(requires, pins, image)
    assert sorted(problems) == [
        "a needs missing>=1, which is neither carried nor in the image",
        "a needs numpy<2, and the image has numpy 2.5.2",
        'b[css] needs tinycss2; extra == "css", which is neither carried nor in the image',
    ]
    assert "a needs fsspec: in the image, version not recorded" in notes
    assert any(n.startswith("b needs debugpy: left out") for n in notes)


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
