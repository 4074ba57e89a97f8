"""@triton.jit code only: the shared rotation helpers and the two kernels that use them."""
