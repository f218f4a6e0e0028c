"""Every exception toolrollout raises, in one tree under :class:`ToolRolloutError`.

``except ToolRolloutError`` catches them all; the branches tell apart who is at fault (the
caller, the model, the engine, a tool backend). The tree with one line per class is drawn in
the docstring of :mod:`toolrollout._exceptions`. Only :class:`ToolRolloutError` and
:class:`UserError` are also exported at the top level.
"""

from toolrollout._exceptions import *  # noqa: F403  (the whole tree; its list is kept there)
from toolrollout._exceptions import __all__ as __all__
