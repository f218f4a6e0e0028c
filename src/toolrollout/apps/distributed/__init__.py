"""Scale-out over several machines: ``toolrollout generate --ray``.

The prompts are dealt to Ray actors (whole GRPO groups per actor); each runs the same
async rollout loop as a one-machine run against the shared engine servers and writes its
own crash-safe shards, and the driver merges them into one output file with the same
schema and row order. Ray is an optional extra (``pip install 'toolrollout[ray]'``) and is
imported only when a sharded run starts. See docs/scale-out.md.
"""

from ._batch import BatchCoordinator as BatchCoordinator
from ._sharding import shard_prompts as shard_prompts

__all__ = [
    "BatchCoordinator",
    "shard_prompts",
]
