"""Leaf records shared by every layer (import nothing above the standard library)."""

from ._resume import RESUME_FORMAT_VERSION as RESUME_FORMAT_VERSION
from ._resume import ResumeFormatError as ResumeFormatError
from ._resume import ResumePoint as ResumePoint

__all__ = ["RESUME_FORMAT_VERSION", "ResumeFormatError", "ResumePoint"]
