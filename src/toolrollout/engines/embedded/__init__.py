"""In-process engine: any Hugging Face causal LM, continuously batched, SGLang semantics.

>>> async with EmbeddedEngine("path/to/model") as engine:  # doctest: +SKIP
...     result = await engine.generate(GenerateRequest(input_ids=(1, 2, 3)))
"""

from toolrollout.engines.embedded._engine import EmbeddedEngine
from toolrollout.engines.embedded._output import EmbeddedOutput, TopLogprobs
from toolrollout.engines.embedded._sampling import GenerationOptions

__all__ = ["EmbeddedEngine", "EmbeddedOutput", "GenerationOptions", "TopLogprobs"]
