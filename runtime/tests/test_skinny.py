"""Which configs a skinny product (a decode step's few rows) is timed over."""

from __future__ import annotations

import triton

from kernel_runtime.tuning import SKINNY_ROWS, configs_for_rows, skinny_problem


def _config(block_m: int, block_n: int = 64) -> triton.Config:
    return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n})


def test_skinny_problems_are_few_rows_of_16_bit_operands():
    assert skinny_problem(1, 2) and skinny_problem(SKINNY_ROWS, 2)
    assert not skinny_problem(SKINNY_ROWS + 1, 2)
    assert not skinny_problem(1, 4)  # fp32 keeps the other tiles


def test_each_kind_of_problem_gets_only_its_own_tiles():
    skinny, wide = _config(SKINNY_ROWS), _config(128)
    configs = [wide, skinny]
    assert configs_for_rows(configs, 1, 2) == [skinny]
    assert configs_for_rows(configs, 1000, 2) == [wide]
    assert configs_for_rows(configs, 1, 4) == [wide]
    # A list with none of the problem's kind (a test's pinned config) is kept whole.
    assert configs_for_rows([wide], 1, 2) == [wide]
    assert configs_for_rows([skinny], 1000, 2) == [skinny]
    # Another name for the row block (a kernel whose rows are not BLOCK_M).
    rows_named_p = [triton.Config({"BLOCK_P": SKINNY_ROWS}), triton.Config({"BLOCK_P": 64})]
    assert configs_for_rows(rows_named_p, 3, 2, block="BLOCK_P") == rows_named_p[:1]
