"""flash_attention_varlen with cu_seqlens that lie (check_seqlens=False): run under
`compute-sanitizer --tool memcheck` to see that no kernel reads or writes outside its tensors.

python3 lab/gpu/varlen_sanitize.py
"""

import torch

from fused_attention import flash_attention_varlen

T, H, D = 300, 4, 64
q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
bad = {
    "last entry past the tokens": [0, 100, 200, 5000],
    "decreasing": [0, 200, 100, 300],
    "negative": [0, -50, 100, 300],
    "first entry not 0": [40, 100, 200, 300],
}
for name, seqlens in bad.items():
    cu = torch.tensor(seqlens, device="cuda", dtype=torch.int32)
    out = flash_attention_varlen(q, k, v, cu, cu, 512, 512, causal=True, check_seqlens=False)
    out.sum().backward()
    torch.cuda.synchronize()
    print(name, "ran; finite output:", bool(torch.isfinite(out.float()).all()))
