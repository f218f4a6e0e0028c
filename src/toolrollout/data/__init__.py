"""Reading prompt datasets: JSONL, parquet, and verl's RL parquet layout."""

from ._datasets import load_prompts as load_prompts

__all__ = ["load_prompts"]
