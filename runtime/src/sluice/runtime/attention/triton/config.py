"""Tile sizes and split limits of the Triton attention kernels, chosen once per device."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class TritonAttentionConfig:
    """How the decode and extend kernels tile their work.

    Decode splits each request's keys into at most `max_kv_splits` pieces of at least
    `min_split_len` tokens (rounded up to whole `decode_block_n` tiles), one program per
    (request, KV head, split); a reduce kernel merges the pieces. Extend tiles the new
    tokens' query rows (`extend_block_m` rows of (token, head-in-group)) against keys in
    tiles of `extend_block_n`. All block sizes are powers of two; on a GPU every matrix
    tile side is at least 16 (`tl.dot`'s minimum).
    """

    decode_block_n: int = 64
    max_kv_splits: int = 16
    min_split_len: int = 256
    extend_block_m: int = 64
    extend_block_n: int = 64
    num_warps: int = 4

    def __post_init__(self) -> None:
        for name in ("decode_block_n", "max_kv_splits", "extend_block_m", "extend_block_n"):
            value = getattr(self, name)
            if value < 1 or value != next_power_of_2(value):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if self.min_split_len < 1:
            raise ValueError("min_split_len must be >= 1")

    @classmethod
    def for_device(cls, device: str) -> TritonAttentionConfig:
        """GPU: tiles sized for tensor cores. CPU (the interpreter, tests only): the same
        kernels with tiles of 16, so a small sequence still spans several tiles and splits."""
        if device.startswith("cuda"):
            return cls()
        return cls(decode_block_n=16, max_kv_splits=4, min_split_len=16,
                   extend_block_m=16, extend_block_n=16, num_warps=1)  # fmt: skip

    def for_head_dim(self, head_dim: int) -> TritonAttentionConfig:
        """Tiles for `head_dim`: past 128 (Gemma's 256) the GPU tiles are halved and the warps
        doubled, so a program's fp32 accumulator (BLOCK_M x head_dim) and its q tile stay in
        registers (64 x 256 fp32 over 4 warps would be 128 registers a thread for the
        accumulator alone, and spill). Tiles of 32 or less (the interpreter's) are kept."""
        if head_dim <= 128 or self.extend_block_m <= 32:
            return self
        return dataclasses.replace(self, decode_block_n=32, extend_block_m=32, extend_block_n=32,
                                   num_warps=8)  # fmt: skip

    def split_len(self, seq_len: int) -> int:
        """Keys per decode split for a request of `seq_len` tokens (the kernels compute the
        same on the device): an even share of `max_kv_splits`, at least `min_split_len`,
        rounded up to whole tiles."""
        share = max(-(-seq_len // self.max_kv_splits), self.min_split_len)
        return -(-share // self.decode_block_n) * self.decode_block_n

    def num_splits(self, seq_len: int) -> int:
        return -(-seq_len // self.split_len(seq_len))
