"""The test suite as a regular package.

verl installs a top-level ``tests`` package into site-packages; without this file it would
shadow this folder (a regular package beats a namespace one) and break ``from tests... import``.
"""
