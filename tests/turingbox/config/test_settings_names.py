"""Every TURINGBOX_* name in the tree is declared: a setting (config/table.py), another variable the appliance reads
(config/envs.py, listed with the rest in config.OTHER_VARIABLES), the test harness's, or an example of a name that is
no variable. The plugin names none: its variables (turingbox_plugin/contract.py) carry its own prefix, TBPLUGIN_.
Only config/ reads the environment of the appliance, and the core (all but the edges cli/ and config/, and the host
and image-build tools of warmup/) parses no command line."""
from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import tokenize

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from turingbox import config
from turingbox.config import envs

APPLIANCE = "entrypoint/turingbox/"
CONFIG = APPLIANCE + "config/"
# the host and image-build tools (`python -m turingbox_warmup.*`): an edge beside cli/, outside the core's package
WARMUP_TOOLS = "warmup/turingbox_warmup/"
# the edges inside the appliance: the console script's commands and the settings
EDGES = (APPLIANCE + "cli/", CONFIG)


def tracked_names() -> dict[str, set[str]]:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    found: dict[str, set[str]] = {}
    for rel in files:
        path = os.path.join(REPO, rel)
        if not os.path.isfile(path):
            continue
        with open(path, errors="replace") as f:
            for m in re.finditer(r"TURINGBOX_[A-Z0-9_]*[A-Z0-9]", f.read()):
                found.setdefault(m.group(0), set()).add(rel)
    return found


def test_every_turingbox_name_in_the_tree_is_declared():
    declared = ({s.env_name for s in config.SETTINGS} | set(config.OTHER_VARIABLES)
                | set(config.HARNESS_VARIABLES) | set(config.EXAMPLES_OF_NO_VARIABLE))
    found = tracked_names()
    unknown = {n: sorted(f)[:5] for n, f in found.items() if n not in declared
               and not n.startswith(config.HARNESS_PREFIX) and n + "_" != config.HARNESS_PREFIX}
    assert not unknown, f"TURINGBOX_* names declared neither in config/table.py nor config/envs.py: {unknown}"
    stale = sorted(set(config.OTHER_VARIABLES) - set(found))
    assert not stale, f"declared variables no longer named anywhere: {stale}"
    assert not set(config.OTHER_VARIABLES) & {s.env_name for s in config.SETTINGS}


def test_envs_registry_feeds_the_other_variables():
    assert {n for n in envs.VARIABLES if n.startswith("TURINGBOX_")} <= set(config.OTHER_VARIABLES)


SETTINGS_MODULE = "entrypoint/turingbox/config/table.py"


def shipped_python() -> list[str]:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "entrypoint", "warmup", "plugin"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return sorted(f for f in files if f.endswith(".py") and os.path.isfile(os.path.join(REPO, f)))


def code_tokens(path: str) -> list[tokenize.TokenInfo]:
    """The names and operators of a module's code (comments and strings, docstrings included, left out)."""
    with open(os.path.join(REPO, path), errors="replace") as f:
        return [t for t in tokenize.generate_tokens(io.StringIO(f.read()).readline)
                if t.type in (tokenize.NAME, tokenize.OP)]


def environment_reads(path: str) -> list[int]:
    """Lines where code reads or writes the process environment: os.environ, getenv/putenv/unsetenv, environ
    imported from os."""
    toks = code_tokens(path)
    lines = {c.start[0] for a, b, c in zip(toks, toks[1:], toks[2:])
             if (a.string, b.string) == ("os", ".") and c.string in ("environ", "environb")}
    lines |= {t.start[0] for t in toks if t.string in ("getenv", "putenv", "unsetenv", "getenvb")}
    lines |= {b.start[0] for a, b in zip(toks, toks[1:]) if a.string == "import" and b.string == "environ"}
    return sorted(lines)


def parses_a_command_line(path: str) -> list[int]:
    toks = code_tokens(path)
    return sorted({b.start[0] for a, b in zip(toks, toks[1:])
                   if a.string in ("import", "from") and b.string == "argparse"})


def test_settings_are_declared_only_in_the_table():
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
    assert set(imports) <= {"turingbox.errors", "turingbox.config", "turingbox_plugin"}, imports
    assert re.search(r"^from turingbox_plugin import contract as plugin_contract$",
                     open(os.path.join(REPO, SETTINGS_MODULE)).read(), re.M)


def turingbox_literals(path: str) -> list[int]:
    """Lines of a module with a string literal (an f-string's text included) that starts with TURINGBOX_: a name of
    the appliance's settings. Docstrings and comments that mention one in passing do not count."""
    with open(os.path.join(REPO, path), errors="replace") as f:
        tree = ast.parse(f.read(), path)
    return sorted({n.lineno for n in ast.walk(tree)
                   if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("TURINGBOX_")})


def test_the_plugin_names_no_turingbox_variable():
    """The plugin reads no TURINGBOX_* setting of the appliance (issue 36): no module of turingbox_plugin, its
    contract included, has a string literal starting with TURINGBOX_, and every variable the contract declares
    carries the plugin's own prefix. The appliance hands the plugin its resolved values under those names."""
    from turingbox_plugin import contract
    modules = [rel for rel in shipped_python() if rel.startswith("plugin/turingbox_plugin/")]
    assert "plugin/turingbox_plugin/contract.py" in modules
    named = {rel: lines for rel in modules if (lines := turingbox_literals(rel))}
    assert not named, f"TURINGBOX_* literals in the plugin (declare a TBPLUGIN_* name in its contract): {named}"
    variables = {k: v for k, v in vars(contract).items() if k.endswith("_ENV") and isinstance(v, str)}
    assert set(variables) >= {"RUNTIME_DIR_ENV", "BENCHMARK_MODE_ENV", "GDN_LIB_ENV", "BENCH_URL_ENV", "API_KEY_ENV"}
    assert contract.PREFIX == "TBPLUGIN_" and all(v.startswith(contract.PREFIX) for v in variables.values()), variables
    assert set(contract.ENGINE_ENV) <= set(variables.values())


def test_only_config_reads_the_environment_of_the_appliance():
    """`grep` finds no os.environ/getenv in the appliance (warmup/'s tools included) outside config/: config/envs.py
    reads (and, to steer a library, writes) every variable that is not a setting; config.load reads the settings."""
    assert any(rel.startswith(WARMUP_TOOLS) for rel in shipped_python())
    readers = {rel: environment_reads(rel) for rel in shipped_python()
               if rel.startswith((APPLIANCE, WARMUP_TOOLS)) and not rel.startswith(CONFIG)}
    readers = {rel: lines for rel, lines in readers.items() if lines}
    assert not readers, f"environment read outside config/ (declare it in config/envs.py and read it there): {readers}"
    inside = {rel for rel in shipped_python() if rel.startswith(CONFIG) and environment_reads(rel)}
    assert inside == {CONFIG + "envs.py"}, inside


def test_the_core_parses_no_command_line():
    """The core takes typed settings: argparse only in the edges (cli/, config/'s add_arguments, warmup/'s tools)."""
    core = [rel for rel in shipped_python() if rel.startswith(APPLIANCE) and not rel.startswith(EDGES)]
    assert any(rel.startswith(APPLIANCE + "plan/") for rel in core)
    parsing = {rel: lines for rel in core if (lines := parses_a_command_line(rel))}
    assert not parsing, f"core modules that import argparse (move the parser into cli/): {parsing}"


def test_the_detectors_see_what_they_look_for(tmp_path):
    """The scans above find a read and an import in code, and nothing in comments or strings; the plugin's scan
    finds a TURINGBOX_ literal, plain or in an f-string, and nothing in a comment or a docstring's prose."""
    probe = tmp_path / "probe.py"
    probe.write_text('import argparse\nimport os\nx = os.environ.get("A")\ny = os.getenv("B")\n'
                     'from os import environ\n# os.environ in a comment\ns = "os.environ in a string"\n')
    rel = os.path.relpath(probe, REPO)
    assert environment_reads(rel) == [3, 4, 5]
    assert parses_a_command_line(rel) == [1]
    name = "TURINGBOX_" + "PROBE"          # spelt apart: the tree-wide scan above would take it for a variable
    probe.write_text(f'"""Reads no {name}."""\n# "{name}" in a comment\nA = "{name}"\n'
                     'b = f"TURINGBOX_{A}"\nc = "TBPLUGIN_C"\n')
    assert turingbox_literals(rel) == [3, 4]


def test_only_the_contract_reads_the_environment_of_the_plugin():
    """The plugin's reads (its contract's variables, and vLLM's, Triton's and CUDA's) and its writes (defaults set
    before vLLM reads them, Triton's cache dir around an autotune lookup) all go through turingbox_plugin/contract.py."""
    readers = {rel: lines for rel in shipped_python() if rel.startswith("plugin/") and (lines := environment_reads(rel))}
    assert set(readers) == {"plugin/turingbox_plugin/contract.py"}, readers
