"""The public surface of ``toolrollout.tools`` is deliberate: sorted, complete, importable."""

from __future__ import annotations

import toolrollout.tools as tools


def test_all_is_sorted_and_importable() -> None:
    names = list(tools.__all__)
    assert names == sorted(names)
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(tools, name), name


def test_every_public_name_is_exported() -> None:
    public = {
        name
        for name, value in vars(tools).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith(tools.__name__)
    }
    assert public <= set(tools.__all__)
