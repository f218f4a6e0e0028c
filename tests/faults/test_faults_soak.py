"""A short soak: thousands of trajectories through the real loop, tools and shard writer.

The full 10,000-trajectory soak is ``benchmarks/bench_soak.py`` (figures in
docs/fault-tolerance.md); this runs the same harness smaller and checks the invariants:
every row on disk exactly once, memory flat after the warm-up waves, no file descriptor
or child process left behind.
"""

from __future__ import annotations

import pytest
from benchmarks.bench_soak import soak


@pytest.mark.slow
def test_soak_keeps_every_row_and_leaks_nothing() -> None:
    report = soak(total=1_000, waves=5, concurrency=512)
    assert report["statuses"] == {"completed": 1_000}
    assert report["rows_on_disk"] == report["distinct_rows"] == 1_000
    assert report["missing_rows"] == 0
    # Nothing of a finished wave stays alive: no trajectory, and the number of objects the
    # garbage collector tracks does not grow with the waves (each trajectory allocates
    # hundreds, so keeping any per-trajectory object would show as thousands).
    assert report["live_trajectories_at_end"] == 0, report["waves"]
    assert report["object_growth_after_warmup"] < 400, report["waves"]
    assert report["rss_growth_after_warmup_mib"] < 16, report["waves"]
    assert report["fd_growth_after_warmup"] < 5, report["waves"]  # a leak is one per call
    assert report["child_growth_after_warmup"] == 0
