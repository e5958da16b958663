"""turingbox Gated DeltaNet kernels for sm_75 and newer (tensor-core prefill, fused MTP decode).

Light to import: no torch, no CUDA. `ops` (torch wrappers), `reference` (fp32 torch
references) and `hook` (vLLM substitution) are imported on demand.
"""

from .compile import compile_report
from .library import GdnLibraryError, library_path, library_status

__all__ = ["compile_report", "GdnLibraryError", "library_path", "library_status"]
