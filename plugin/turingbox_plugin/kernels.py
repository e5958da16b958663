"""The plugin's own Triton kernels (GDN kernels live in turingbox_plugin.gdn).

`scaled_copy_kernel` is the toolchain probe: `verify` runs it against torch on a GPU and compiles
it for any arch without one, proving Triton + ptxas produce code for the target.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def scaled_copy_kernel(src_ptr, dst_ptr, n_elements, scale, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(src_ptr + offs, mask=mask, other=0.0)
    tl.store(dst_ptr + offs, x * scale, mask=mask)


def scaled_copy(src, scale: float, block: int = 1024):
    """dst = src * scale with the Triton kernel (works under TRITON_INTERPRET=1 on CPU tensors)."""
    import torch

    dst = torch.empty_like(src)
    n = src.numel()
    scaled_copy_kernel[(triton.cdiv(n, block),)](src, dst, n, scale, BLOCK=block)
    return dst


# name -> (jit function, signature, constexprs) for compile-only reports.
COMPILE_SPECS = {
    "scaled_copy_kernel[fp16]": (scaled_copy_kernel,
                                 {"src_ptr": "*fp16", "dst_ptr": "*fp16", "n_elements": "i32", "scale": "fp32",
                                  "BLOCK": "constexpr"}, {"BLOCK": 1024}),
    "scaled_copy_kernel[fp32]": (scaled_copy_kernel,
                                 {"src_ptr": "*fp32", "dst_ptr": "*fp32", "n_elements": "i32", "scale": "fp32",
                                  "BLOCK": "constexpr"}, {"BLOCK": 1024}),
}
