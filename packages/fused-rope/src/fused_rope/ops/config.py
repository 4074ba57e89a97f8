"""Launch configurations: tile shape and warps from head count, head dim and dtype.

Both kernels run one program per (token, block of BLOCK_R rows), a row being one head: a 2-D
(BLOCK_R, BLOCK_P) tile of rotary pairs plus a (BLOCK_R, BLOCK_PASS) tile of pass-through
columns. The rules, for a memory-bound kernel on an H100 (about 20-40 KiB must be in flight
per SM to cover DRAM latency at 3 TB/s):
- BLOCK_P = next_pow2(d2 / 2) and BLOCK_PASS = next_pow2(head_dim - d2) (at least 2; 1 means
  the pass-through columns are not touched: in place, or none): whole rows, so a small
  rotary_percent shrinks the pair tile instead of wasting lanes on it;
- BLOCK_R: as many rows as fit in TILE_BYTES of input, so short heads (or few of them) still
  give each program several KiB to move, and long heads (512) give fewer rows, not bigger
  programs. 16 KiB (H100, q,k (4, 32, 4096, D) bf16 forward): D=256 takes 0.370 ms with 32-row
  tiles against 0.392 with the 16 rows of 8 KiB (Liger 0.368); D=128 is 0.189-0.190 either way.
  The HF-style q,k kernel has its own caps (32 KiB, 16 warps: see ops/rope_qk.py);
- num_warps: one warp per BYTES_PER_THREAD * 32 bytes of tile (about 4 16-byte vectors per
  thread in flight), 1 to 8;
- TransformerEngine-style launches compute cos/sin of the angles in the kernel. The compiler
  keeps that computation in a compact 1-D layout (each angle once per program, then shared
  through shared memory) only while the angle vector has at least as many elements as the
  program has threads (Triton treats such a load as too expensive to replicate); with more
  threads every thread row would recompute the sin/cos of its columns. So those launches use
  at most (number of angles per row) / 32 warps, and their threads carry more rows each.
Configurations are cached per shape, and each launcher caches its whole plan (the Launch objects
with their grid and every argument the shape fixes), so the host pays for this once per shape.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, NamedTuple

import triton

TILE_BYTES = 16384
BYTES_PER_THREAD = 64
MAX_WARPS = 8


@dataclass(frozen=True)
class LaunchConfig:
    block_r: int
    block_p: int
    block_pass: int
    num_warps: int
    row_bytes: int  # input bytes of one tile row


def _floor_power_of_2(n: int) -> int:
    return 1 << (n.bit_length() - 1)


@functools.cache
def launch_config(
    n_rows: int, half: int, n_pass: int, element_size: int, copy_pass: bool, angle_lanes_per_pair: int,
    tile_bytes: int = TILE_BYTES, max_warps: int = MAX_WARPS,
) -> LaunchConfig:  # fmt: skip
    """Tile and warps for rows of `half` pairs and `n_pass` pass-through columns.

    n_rows: rows one position's programs share (the tile's height is capped by it).
    copy_pass: the pass-through columns are copied (False in place); BLOCK_PASS > 1 says so to
    the kernel.
    angle_lanes_per_pair: angles the kernel computes cos/sin of per pair per row vector
    (0: cos/sin are loaded, HF-style; 1: one vector per pair member; 2: one flat vector of
    both members, interleaved pairs split in registers).
    tile_bytes, max_warps: the caps on a tile's input bytes and its warps.
    """
    block_p = triton.next_power_of_2(half)
    copy_pass = copy_pass and n_pass > 0
    block_pass = max(2, triton.next_power_of_2(n_pass)) if copy_pass else 1
    row_bytes = (2 * block_p + (block_pass if copy_pass else 0)) * element_size
    # tl.arange and num_warps need powers of 2: the most rows that fit and the warps the tile's
    # bytes ask for are rounded down to one (a partial rotary row, pairs plus pass-through
    # columns, is not a power of 2 bytes).
    block_r = min(triton.next_power_of_2(n_rows), _floor_power_of_2(max(1, tile_bytes // row_bytes)))
    num_warps = _floor_power_of_2(max(1, min(max_warps, block_r * row_bytes // (BYTES_PER_THREAD * 32))))
    if angle_lanes_per_pair:
        num_warps = max(1, min(num_warps, angle_lanes_per_pair * block_p // 32))
    return LaunchConfig(block_r, block_p, block_pass, num_warps, row_bytes)


class KernelChoice(NamedTuple):
    """The tile policy's pick for one shape: the grid's row blocks, the warps and the kernel's
    compile-time arguments (read-only, by name)."""

    n_row_blocks: int
    num_warps: int
    constexprs: Mapping[str, Any]


def kernel_choice(n_row_blocks: int, num_warps: int, **constexprs: Any) -> KernelChoice:
    return KernelChoice(n_row_blocks, num_warps, MappingProxyType(constexprs))


# Column offsets are int32 in the kernels (an int32 arange times the column stride): an input whose
# last column lies further than this from its first is copied to a contiguous last dim first.
MAX_COLUMN_SPAN = 2**31 - 1


def reads_columns(stride_d: int, head_dim: int) -> bool:
    """Whether the kernels read a head of `head_dim` columns `stride_d` elements apart in place."""
    return stride_d == 1 or (head_dim - 1) * stride_d <= MAX_COLUMN_SPAN
