"""PublishedCache under concurrent builders, and the shared argument checks' messages."""

from __future__ import annotations

import threading

import pytest
import torch

from kernel_runtime.cache import PublishedCache
from kernel_runtime.validation import check_device, check_float, check_int, check_tensor


def test_concurrent_builders_all_get_the_first_published_value():
    cache = PublishedCache()
    barrier = threading.Barrier(8)
    seen = []

    def work(i):
        barrier.wait()
        seen.append(cache.get_or_build("key", lambda: ("built by", i)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(seen)) == 1 and seen[0] == cache.get("key")


def test_a_full_cache_starts_over_instead_of_growing():
    cache = PublishedCache(maxsize=2)
    for key in range(5):
        cache.publish(key, key)
    assert len(cache) <= 2 and cache.get(4) == 4


def test_check_tensor_names_the_argument_and_the_dtypes():
    with pytest.raises(TypeError, match=r"^w must be a torch.Tensor, got list$"):
        check_tensor("w", [1.0])
    with pytest.raises(TypeError, match=r"q has dtype torch.float32; supported: float16, bfloat16 \(cast"):
        check_tensor("q", torch.zeros(1), (torch.float16, torch.bfloat16))


def test_index_tensors_get_no_floating_point_hint():
    with pytest.raises(TypeError, match=r"^position_ids has dtype torch.float32; supported: int32, int64$"):
        check_tensor("position_ids", torch.zeros(1), (torch.int32, torch.int64))


def test_check_device_names_the_argument_and_says_how_to_run_without_a_gpu():
    with pytest.raises(ValueError, match=r"^x is on meta; the kernels run on .*TRITON_INTERPRET=1"):
        check_device(x=torch.empty(1, device="meta"))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_check_float_refuses_non_finite_and_out_of_range(value):
    with pytest.raises(ValueError, match=r"^eps=.* must be a finite number in \(0.0, inf\]$"):
        check_float("eps", value, 0.0, include_low=False)


def test_check_int_refuses_bools_and_out_of_range():
    with pytest.raises(TypeError, match="steps must be an int, got bool"):
        check_int("steps", True)
    with pytest.raises(ValueError, match=r"^steps=0 must be >= 1$"):
        check_int("steps", 0, low=1)
