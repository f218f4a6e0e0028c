"""The package version: the one place it is written (pyproject reads it through hatch).

A literal rather than ``importlib.metadata.version``: reading the installed metadata costs
a noticeable part of ``import toolrollout``, and a source tree that was never installed
still reports its real version.
"""

__version__ = "0.1.0"
