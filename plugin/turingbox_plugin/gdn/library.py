"""Find and load libturingbox_gdn.so with ctypes (no torch C++ ABI involved).

The library is plain CUDA C with extern "C" entry points taking raw device pointers, sizes,
strides and a cudaStream_t. It is built by plugin/build_gdn.sh at image build time or on the
GPU machine; it is never committed.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

LIB_NAME = "libturingbox_gdn.so"
ABI_VERSION = 1
from turingbox_plugin.contract import GDN_LIB_ENV as ENV_LIB, gdn_library_override

_c_ll = ctypes.c_longlong
_c_int = ctypes.c_int
_c_float = ctypes.c_float
_c_ptr = ctypes.c_void_p

# Argument lists of the extern "C" entry points, in order (kept next to the C prototypes'
# order in plugin/csrc/*.cu; tests check the wrapper builds exactly this many arguments).
CHUNK_FWD_ARGTYPES = (
    [_c_int] + [_c_ptr] * 5 + [_c_ll] * 6 + [_c_ptr, _c_int, _c_ll] + [_c_int] * 4
    + [_c_float, _c_ptr, _c_ptr, _c_ptr, _c_ll, _c_ll, _c_ptr, _c_ll, _c_ptr]
)
SPEC_DECODE_ARGTYPES = (
    [_c_int, _c_ptr, _c_int, _c_ptr, _c_int, _c_ll, _c_ptr, _c_int, _c_ll, _c_ptr, _c_int]
    + [_c_ptr] * 3 + [_c_ll] * 6
    + [_c_ptr, _c_ptr, _c_ll, _c_ptr, _c_ll]
    + [_c_ptr, _c_int, _c_int, _c_ptr, _c_int, _c_ll, _c_ll, _c_ptr]
    + [_c_int] * 4 + [_c_float] * 3 + [_c_int, _c_int, _c_ptr]
)


class GdnLibraryError(RuntimeError):
    """The kernel library is missing, unloadable or of the wrong ABI (one sentence)."""


_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}


def library_path(env: dict | None = None) -> Path:
    """Where the library is expected: the contract's GDN_LIB_ENV, else the package's lib/ folder."""
    override = gdn_library_override(env)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent.parent / "lib" / LIB_NAME


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.tb_gdn_abi_version.restype = _c_int
    lib.tb_gdn_abi_version.argtypes = []
    lib.tb_gdn_error_string.restype = ctypes.c_char_p
    lib.tb_gdn_error_string.argtypes = [_c_int]
    lib.tb_gdn_chunk_workspace_bytes.restype = _c_ll
    lib.tb_gdn_chunk_workspace_bytes.argtypes = [_c_ll, _c_int]
    lib.tb_gdn_chunk_fwd.restype = _c_int
    lib.tb_gdn_chunk_fwd.argtypes = CHUNK_FWD_ARGTYPES
    lib.tb_gdn_spec_decode.restype = _c_int
    lib.tb_gdn_spec_decode.argtypes = SPEC_DECODE_ARGTYPES
    return lib


def load_library(path: str | os.PathLike | None = None) -> ctypes.CDLL:
    """Load (once) and return the library; raise GdnLibraryError with a reason otherwise."""
    with _lock:
        p = Path(path) if path is not None else library_path()
        if str(p) in _loaded:
            return _loaded[str(p)]
        if not p.is_file():
            raise GdnLibraryError(
                f"GDN kernel library {p} is missing; build it with plugin/build_gdn.sh "
                f"or point {ENV_LIB} at it."
            )
        try:
            lib = _bind(ctypes.CDLL(str(p)))
        except (OSError, AttributeError) as exc:
            raise GdnLibraryError(f"GDN kernel library {p} cannot be loaded: {exc}.") from exc
        version = lib.tb_gdn_abi_version()
        if version != ABI_VERSION:
            raise GdnLibraryError(
                f"GDN kernel library {p} has ABI version {version}, expected {ABI_VERSION}; rebuild it."
            )
        _loaded[str(p)] = lib
        return lib


def library_status() -> tuple[bool, str]:
    """(usable, reason) without raising."""
    try:
        load_library()
    except GdnLibraryError as exc:
        return False, str(exc)
    return True, f"loaded {library_path()}"


def check(lib: ctypes.CDLL, code: int, what: str) -> None:
    if code != 0:
        msg = lib.tb_gdn_error_string(code).decode(errors="replace")
        raise RuntimeError(f"turingbox GDN {what} failed: {msg} (code {code}).")
