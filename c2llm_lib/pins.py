"""Pinned packages (name, version, wheel sha256) of the unseen-library evaluation, and `unseen_packages` parsed."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .checks import ConfigError

# name: (version, sha256 of its py3 wheel on PyPI)
PINNED: dict[str, tuple[str, str]] = {
    "sortedcontainers": ("2.4.0", "a163dcaede0f1c021485e957a39245190e74249897e2ae4b2aa38595db237ee0"),
    "toolz": ("1.2.0", "890f820b1cb8152785aaf9386d8707770110809035800985ca65cb24ce1120ef"),
    "tabulate": ("0.10.0", "f0b0622e567335c8fabaaa659f1b33bcb6ddfe2e496071b743aa113f8774f2d3"),
    "humanize": ("4.17.0", "02d0899527760efe18011944f882df4970943b4cdff7b5a0ba7fed43a576ef98"),
    "bidict": ("0.24.1", "fd3eaa737917d8a14f4baa391670c433c4e3f6f5fd2cd99d4bf436437f432364"),
}
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_VERSION = re.compile(r"[0-9][0-9A-Za-z.+!]*")
_SHA256 = re.compile(r"sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class PackagePin:
    """One package of the index, pinned: its name, version and the sha256 of its wheel."""

    name: str
    version: str
    sha256: str

    def __str__(self) -> str:
        return f"{self.name} {self.version} sha256:{self.sha256}"


def canonical(name: str) -> str:
    """A distribution name compared as the index compares it (PEP 503: case-blind, runs of - _ . alike)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def package_pins(entries: Sequence[str]) -> list[PackagePin]:
    """`unseen_packages` as pins (a `PINNED` name or "<name> <version> sha256:<hex>"); a bad one is a `ConfigError`."""
    if isinstance(entries, str) or not isinstance(entries, Sequence):
        raise ConfigError(f"parameter 'unseen_packages' must be a list of package names or pins, got "
                          f"{type(entries).__name__} {entries!r}")  # fmt: skip
    pins, seen = [], {}
    for i, entry in enumerate(entries):
        where = f"parameter 'unseen_packages' entry {i} {entry!r}"
        tokens = entry.split() if isinstance(entry, str) else []
        if len(tokens) == 1:
            pinned = {canonical(name): name for name in PINNED}
            if canonical(tokens[0]) not in pinned:
                raise ConfigError(f"{where}: no pinned package of that name (pinned: {', '.join(sorted(PINNED))}); "
                                  "name one of them, or pin another pure-Python wheel as '<name> <version> "
                                  "sha256:<the wheel's sha256 as the index lists it>'")  # fmt: skip
            name = pinned[canonical(tokens[0])]
            pin = PackagePin(name, *PINNED[name])
        elif len(tokens) == 3 and _NAME.fullmatch(tokens[0]) and _VERSION.fullmatch(tokens[1]):
            digest = _SHA256.fullmatch(tokens[2])
            if digest is None:
                raise ConfigError(f"{where}: the third part must be the wheel's digest as sha256:<64 lowercase hex "
                                  f"digits>, got {tokens[2]!r}")  # fmt: skip
            pin = PackagePin(tokens[0], tokens[1], digest.group(1))
        else:
            raise ConfigError(f"{where}: expected a package name ({', '.join(sorted(PINNED))}) or '<name> <version> "
                              "sha256:<hex>'")  # fmt: skip
        if canonical(pin.name) in seen:
            raise ConfigError(f"{where}: package {pin.name!r} is also entry {seen[canonical(pin.name)]}")
        seen[canonical(pin.name)] = i
        pins.append(pin)
    return pins
