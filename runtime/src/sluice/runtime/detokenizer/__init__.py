"""Detokenization: incremental text per request (`incremental`) and the process (`process`)."""

from sluice.runtime.detokenizer.incremental import DetokDelta, IncrementalDetokenizer

__all__ = ["DetokDelta", "IncrementalDetokenizer"]
