"""In-process engine: any Hugging Face causal LM, continuously batched, SGLang semantics.

>>> async with EmbeddedEngine("path/to/model") as engine:  # doctest: +SKIP
...     result = await engine.generate(GenerateRequest(input_ids=(1, 2, 3)))
"""

from toolrollout._extras import require_extra

require_extra("serve", "the embedded engine (EmbeddedEngine)", "torch", "transformers")

from toolrollout.engines.embedded._engine import EmbeddedEngine  # noqa: E402
from toolrollout.engines.embedded._output import EmbeddedOutput, TopLogprobs  # noqa: E402
from toolrollout.engines.embedded._sampling import GenerationOptions  # noqa: E402

__all__ = ["EmbeddedEngine", "EmbeddedOutput", "GenerationOptions", "TopLogprobs"]
