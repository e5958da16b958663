"""A small Triton kernel shaped like vLLM's cold kernels (pointers, an int size, constexprs)."""
import triton
import triton.language as tl


@triton.jit
def scale_copy_kernel(src_ptr, dst_ptr, n, scale, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(src_ptr + offs, mask=mask)
    tl.store(dst_ptr + offs, x * scale, mask=mask)
