"""The trainer packages are installed, and everything they declare is, but two caps.

verl and ms-swift are installed with ``--no-deps`` because their transformers/trl caps
conflict with the project's versions; these checks make sure that is the only thing left
out: every other requirement in their own metadata (one level of extras deep, e.g.
``ray[default]``) must be installed at a version they accept.
"""

from __future__ import annotations

import importlib.metadata as md

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from tests.integrations._trainers import (
    INSTALL_HINT,
    SKIP_ENV,
    skip_requested,
    trainer_import_error,
)

# Distribution -> the requirements of it that are knowingly not met (docs/trainers.md).
OVERRIDDEN = {
    "verl": {"transformers"},
    "ms-swift": {"transformers", "trl"},
}
IMPORT_NAME = {"verl": "verl", "ms-swift": "swift"}


def _missing(message: str) -> None:
    if skip_requested():
        pytest.skip(f"{message} ({SKIP_ENV} is set)")
    pytest.fail(f"{message}; install with: {INSTALL_HINT} (or set {SKIP_ENV}=1 to skip)")


def _unmet(requirement: Requirement, seen: set[tuple[str, str]]) -> list[str]:
    """Why ``requirement`` is not satisfied here (empty when it is), extras included."""
    name = canonicalize_name(requirement.name)
    try:
        version = md.version(name)
    except md.PackageNotFoundError:
        return [f"{requirement} (not installed)"]
    problems = []
    if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
        problems.append(f"{requirement} (installed {version})")
    for extra in sorted(requirement.extras):
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        for line in md.requires(name) or []:
            sub = Requirement(line)
            marker = sub.marker
            if marker is not None and marker.evaluate({"extra": extra}):
                if not marker.evaluate({"extra": ""}):
                    problems += _unmet(sub, seen)
    return problems


@pytest.mark.parametrize("dist", sorted(OVERRIDDEN))
def test_trainer_imports(dist: str) -> None:
    error = trainer_import_error(IMPORT_NAME[dist])
    if error is not None:
        _missing(f"{dist} does not import: {error}")


def _base_requirements(dist: str) -> list[Requirement]:
    """What ``dist`` needs without any of its extras."""
    out = []
    for line in md.requires(dist) or []:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            out.append(requirement)
    return out


@pytest.mark.parametrize("dist", sorted(OVERRIDDEN))
def test_declared_requirements_are_installed_except_the_overrides(dist: str) -> None:
    try:
        requires = _base_requirements(dist)
    except md.PackageNotFoundError:
        _missing(f"{dist} is not installed")
        return
    unmet: dict[str, list[str]] = {}
    for requirement in requires:
        problems = _unmet(requirement, set())
        if problems:
            unmet[canonicalize_name(requirement.name)] = problems
    for name in OVERRIDDEN[dist]:
        unmet.pop(name, None)
    assert not unmet, (
        f"{dist} declares requirements that are missing or out of range: {unmet}; "
        "add them to requirements/trainer-deps.txt"
    )
    # The overrides lift caps only: a floor or exact pin of theirs must still hold.
    for requirement in requires:
        name = canonicalize_name(requirement.name)
        if name not in OVERRIDDEN[dist]:
            continue
        installed = md.version(name)
        for spec in requirement.specifier:
            if spec.operator in (">=", ">", "==", "~=", "==="):
                assert spec.contains(installed, prereleases=True), (
                    f"{dist} needs {requirement}, installed {name} {installed}"
                )
