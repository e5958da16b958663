"""Every TURINGBOX_* name in the shipped code is a declared setting (flag + variable, resolved once), or one of
the few documented below that are not the appliance's settings. A new ad hoc variable fails here, and so does a
setting declared outside turingbox/config/table.py or a new reader of the ambient environment (os.environ)."""
from __future__ import annotations

import io
import os
import re
import subprocess
import tokenize

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from turingbox.config import HARNESS_PREFIX, HARNESS_VARIABLES
from turingbox.config import OTHER_VARIABLES as NOT_APPLIANCE_SETTINGS   # declared beside the table


def names_in_shipped_files() -> dict[str, set[str]]:
    files = subprocess.run(["git", "ls-files", "entrypoint", "plugin", "Dockerfile", "compose.yaml", "deploy"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    found: dict[str, set[str]] = {}
    for rel in files:
        if not rel.endswith((".py", ".sh", ".yaml", ".yml", "Dockerfile")) or not os.path.isfile(os.path.join(REPO, rel)):
            continue
        with open(os.path.join(REPO, rel), errors="replace") as f:
            for m in re.finditer(r"TURINGBOX_[A-Z0-9_]+", f.read()):
                found.setdefault(m.group(0), set()).add(rel)
    return found


def test_every_turingbox_variable_is_a_setting_or_documented():
    from turingbox.config import REGISTRY     # the one table: complete without importing any feature module
    declared = {s.env_name for s in REGISTRY.values()}
    found = names_in_shipped_files()
    # config/table.py names the harness's own variables (so the CLI does not refuse them as typos), nothing else does
    harness = {n for n in found if n in HARNESS_VARIABLES or n.startswith(HARNESS_PREFIX)}
    assert all(found[n] == {SETTINGS_MODULE} for n in harness), {n: sorted(found[n]) for n in harness}
    unknown = {n: sorted(f) for n, f in found.items() if n not in declared and n not in NOT_APPLIANCE_SETTINGS
               and n not in harness}
    assert not unknown, f"TURINGBOX_* names that are neither declared settings nor documented exceptions: {unknown}"
    stale = sorted(set(NOT_APPLIANCE_SETTINGS) - set(found))
    assert not stale, f"documented exceptions no longer used: {stale}"
    assert not set(NOT_APPLIANCE_SETTINGS) & declared, "a declared setting is also listed as an exception"


SETTINGS_MODULE = "entrypoint/turingbox/config/table.py"

# Who may read the process environment (os.environ). The resolvers: the appliance's settings, the engine
# launcher's environment builder (the environment vLLM inherits) and the plugin's own resolver. Everyone
# else is a documented exception, each read with a `# environ: why` comment on or just above it.
ENVIRON_RESOLVERS = {
    "entrypoint/turingbox/config/__init__.py": "load(): flag > TURINGBOX_* env > default",
    "entrypoint/turingbox/config/table.py": "unknown_variables(): the TURINGBOX_* names that are no setting",
    "entrypoint/turingbox/engine/launch.py": "parent_env(): the environment vLLM inherits (vllm_env builds on it)",
    "plugin/turingbox_plugin/contract.py": "the plugin's one reader of its contract's variables",
}
ENVIRON_EXCEPTIONS = {
    "entrypoint/turingbox/gpus/inventory.py": "NVIDIA_/CUDA_VISIBLE_DEVICES (container runtime, CUDA)",
    "entrypoint/turingbox/build/aot.py": "image build: TRITON_CACHE_DIR, CC, TURINGBOX_VLLM_SRC",
    "entrypoint/turingbox/build/aot_specs/derive.py": "image build: TURINGBOX_VLLM_SRC",
    "entrypoint/turingbox/build/flashinfer_aot.py": "image build: CUDA/CC variables, source paths, the build env",
    "entrypoint/turingbox/build/modelinfos.py": "image build: VLLM_CACHE_ROOT for vLLM's own model inspection",
    "entrypoint/turingbox/build/bake.py": "host tool: forwards the host's TURINGBOX_* into the planning container",
    "entrypoint/turingbox/build/seed_docker.py": "host tool: the volume name; forwards TURINGBOX_* into the container",
    "plugin/turingbox_plugin/__init__.py": "defaults for vLLM's/Triton's variables",
    "plugin/turingbox_plugin/autotune.py": "Triton's TRITON_CACHE_DIR around an autotune lookup",
    "plugin/turingbox_plugin/worker.py": "Triton's TRITON_CACHE_DIR",
    "plugin/turingbox_plugin/doctor.py": "TRITON_PTXAS_PATH, VLLM_PLUGINS (reported)",
    "plugin/turingbox_plugin/cli.py": "VLLM_LOGGING_STREAM",
    "plugin/turingbox_plugin/gdn/compile.py": "CUDA_HOME",
}
ENVIRON_COMMENT = "# environ:"
COMMENT_REACH = 10       # lines above a read that its comment may stand (one comment for a save/restore block)


def shipped_python() -> list[str]:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "entrypoint", "plugin"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return sorted(f for f in files if f.endswith(".py") and os.path.isfile(os.path.join(REPO, f)))


def environ_lines(lines: list[str]) -> list[int]:
    """0-based lines where code (not a comment or docstring) reads os.environ."""
    toks = [t for t in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline)
            if t.type in (tokenize.NAME, tokenize.OP)]
    return sorted({a.start[0] - 1 for a, b, c in zip(toks, toks[1:], toks[2:])
                   if (a.string, b.string, c.string) == ("os", ".", "environ")})


def test_settings_are_declared_only_in_settings_py():
    """One table: no module but turingbox/config/table.py constructs a Setting or declares one."""
    pattern = re.compile(r"\bdeclare\(|\bSetting\(")
    outside = {}
    for rel in shipped_python():
        if rel == SETTINGS_MODULE:
            continue
        with open(os.path.join(REPO, rel), errors="replace") as f:
            hits = [i + 1 for i, line in enumerate(f) if pattern.search(line)]
        if hits:
            outside[rel] = hits
    assert not outside, f"settings declared outside {SETTINGS_MODULE}: {outside}"


def test_settings_module_imports_nothing_above_it():
    """config/table.py is the bottom layer but errors: its parsers' vocabulary lives in it (or below, in the plugin's
    contract, which the appliance and the plugin share)."""
    with open(os.path.join(REPO, SETTINGS_MODULE)) as f:
        imports = re.findall(r"^\s*(?:from|import)\s+(turingbox[\w.]*)", f.read(), re.M)
    assert set(imports) <= {"turingbox.errors", "turingbox_plugin"}, imports
    assert re.search(r"^from turingbox_plugin import contract as plugin_contract$",
                     open(os.path.join(REPO, SETTINGS_MODULE)).read(), re.M)


def test_the_plugin_names_turingbox_variables_only_in_its_contract():
    """The plugin reads no TURINGBOX_* setting of the appliance: every such name it uses is declared in
    turingbox_plugin/contract.py (docstrings and comments aside)."""
    named = {}
    for rel in shipped_python():
        if not rel.startswith("plugin/") or rel.endswith("/contract.py"):
            continue
        with open(os.path.join(REPO, rel), errors="replace") as f:
            code = [line for line in f if not line.lstrip().startswith("#")]
        hits = [m for line in code for m in re.findall(r"[\"'](TURINGBOX_[A-Z0-9_]+)", line)]
        if hits:
            named[rel] = hits
    assert not named, named


def test_os_environ_readers_are_the_allow_list():
    users = {}
    for rel in shipped_python():
        with open(os.path.join(REPO, rel), errors="replace") as f:
            lines = f.read().splitlines()
        reads = environ_lines(lines)
        if reads:
            users[rel] = (lines, reads)
    allowed = set(ENVIRON_RESOLVERS) | set(ENVIRON_EXCEPTIONS)
    unknown = sorted(set(users) - allowed)
    assert not unknown, (f"os.environ read outside the resolvers and documented exceptions: {unknown}; resolve a "
                         f"TURINGBOX_* value as a declared setting and pass it on, or document the exception here")
    stale = sorted(allowed - set(users))
    assert not stale, f"allow-listed files that no longer read os.environ: {stale}"
    uncommented = []
    for rel in sorted(set(users) & set(ENVIRON_EXCEPTIONS)):
        lines, reads = users[rel]
        for i in reads:
            window = lines[max(0, i - COMMENT_REACH):i + 1]
            if not any(ENVIRON_COMMENT in line for line in window):
                uncommented.append(f"{rel}:{i + 1}")
    assert not uncommented, f"exceptions without a '{ENVIRON_COMMENT} why' comment: {uncommented}"
