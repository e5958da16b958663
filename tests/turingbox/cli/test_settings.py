"""Every declared setting through the real CLI (`python -m turingbox ...` subprocesses): a bad value is refused
with exit 2 and one sentence naming the variable, and a mistyped variable is refused with the closest name,
before the command does any work. The cases run concurrently once per module; each test reads its result."""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from turingbox import config as S
from turingbox.config import doc as D

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GPUS = os.path.join(REPO, "tests", "fixtures", "gpus", "1xh200.json")

# Settings whose parser takes any text, so no value is bad at resolve time (what uses them refuses later).
ANY_TEXT = {
    "model_revision": "a branch, tag or commit name; the hub answers whether it exists",
    "served_model_name": "any name vLLM may serve under",
    "host": "an address or a host name; binding it tells",
    "plan_file": "a path; serve refuses one it cannot read",
    "cache_dir": "a path", "baked_cache_dir": "a path", "aot_triton_dir": "a path",
    "aot_flashinfer_dir": "a path", "aot_modelinfos_dir": "a path",
}
# The first value of these that a setting's parser refuses is its bad value: out of range, then not a value.
BAD_VALUES = ("-5", "nonsense", "   ", "'unclosed")


def bad_value(setting: S.Setting) -> str | None:
    for value in BAD_VALUES:
        try:
            setting.parse(value)
        except ValueError:
            return value
    return None


def command_for(name: str) -> list[str]:
    """The cheapest command that resolves this setting before any work: plan, else warmup, else serve."""
    readers = [c for c, _how in D.readers(name)]
    for command in ("plan", "warmup", "serve"):
        if command in readers:
            return [command]
    raise AssertionError(f"no plan/warmup/serve reads {name}")


def typo(env_name: str, i: int) -> str:
    """A slip of the fingers in what follows TURINGBOX_, a different kind for successive settings."""
    prefix, tail = env_name[:len("TURINGBOX_")], env_name[len("TURINGBOX_"):]
    m = len(tail) // 2
    kinds = [prefix + tail[:m] + tail[m + 1:],                                  # a letter dropped
             prefix + tail[:m] + tail[m + 1:m + 2] + tail[m] + tail[m + 2:],    # two letters swapped
             prefix + tail[:m] + tail[m] + tail[m:],                            # a letter doubled
             env_name + "S",                                                    # a plural
             env_name.lower()]                                                  # lower case
    known = {s.env_name for s in S.SETTINGS} | set(S.OTHER_VARIABLES) | set(S.HARNESS_VARIABLES)
    for k in range(len(kinds)):
        candidate = kinds[(i + k) % len(kinds)]
        if candidate not in known:          # a swap of two equal letters is no typo
            return candidate
    raise AssertionError(env_name)


def run(argv: list[str], env: dict[str, str], tmp: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.upper().startswith("TURINGBOX_")
            and k not in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")}
    # nothing may start if a refusal regresses: no engine, demo models and caches in a private folder
    # (the GPUs by variable, not flag: a flag would win over the bad TURINGBOX_GPUS_JSON case)
    full.update(TURINGBOX_GPUS_JSON=GPUS, TURINGBOX_MODELS_DIR=os.path.join(tmp, "models"),
                TURINGBOX_CACHE_DIR=os.path.join(tmp, "cache"), TURINGBOX_VLLM_COMMAND="false", TMPDIR=tmp)
    full.update(env)
    return subprocess.run([sys.executable, "-m", "turingbox", *argv], capture_output=True, text=True, env=full,
                          cwd=REPO, timeout=120)


BAD_CASES = {s.name: (command_for(s.name), {s.env_name: bad_value(s)}) for s in S.SETTINGS if s.name not in ANY_TEXT}
TYPO_CASES = {s.name: (command_for(s.name), {typo(s.env_name, i): "1"}) for i, s in enumerate(S.SETTINGS)}
# serve resolves the cache settings at its edge too (before binding, planning or starting): a bad one is exit 2,
# not a cold start with a warning
SERVE_CACHE_CASES = {n: (["serve"], {S.REGISTRY[n].env_name: bad_value(S.REGISTRY[n])})
                     for n in S.CACHE_SETTINGS if n not in ANY_TEXT and bad_value(S.REGISTRY[n]) is not None}
COMMAND_CASES = {c: (c.split(), {"TURINGBOX_MAX_MODEL_LENGTH": "32768"}) for c in sorted(D.READING_COMMANDS)}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cases = {("bad", k): v for k, v in BAD_CASES.items()}
    cases.update({("typo", k): v for k, v in TYPO_CASES.items()})
    cases.update({("serve-cache", k): v for k, v in SERVE_CACHE_CASES.items()})
    cases.update({("command", k): v for k, v in COMMAND_CASES.items()})
    tmp = str(tmp_path_factory.mktemp("settings-cli"))
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {key: pool.submit(run, argv, env, tmp) for key, (argv, env) in cases.items()}
        out = {key: f.result() for key, f in futures.items()}
    # nothing ran: no demo model was written, no cache entry made
    assert not os.path.exists(os.path.join(tmp, "models")) and not os.path.exists(os.path.join(tmp, "cache"))
    return out


def one_sentence(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr and r.stdout == "", r.stderr
    return lines[0]


def test_the_lists_cover_every_setting():
    assert set(BAD_CASES) | set(ANY_TEXT) == set(S.REGISTRY) and not set(BAD_CASES) & set(ANY_TEXT)
    assert all(S.REGISTRY[n].parse is str for n in ANY_TEXT), "a setting listed as any-text now parses its value"
    assert all(env[next(iter(env))] is not None for _, env in BAD_CASES.values())


@pytest.mark.parametrize("name", sorted(BAD_CASES))
def test_a_bad_value_is_refused_naming_the_variable(results, name):
    s = S.REGISTRY[name]
    value = BAD_CASES[name][1][s.env_name]
    line = one_sentence(results[("bad", name)])
    shown = "***" if s.secret else repr(value)
    # cli.py folds every run of whitespace to one space, so a message stays one line whatever the value held
    assert line.startswith(" ".join(f"turingbox: {s.env_name} {shown} is invalid: ".split()) + " "), line
    assert line.endswith("."), line


@pytest.mark.parametrize("name", sorted(SERVE_CACHE_CASES))
def test_serve_refuses_a_bad_cache_setting(results, name):
    line = one_sentence(results[("serve-cache", name)])
    assert S.REGISTRY[name].env_name in line, line


@pytest.mark.parametrize("name", sorted(TYPO_CASES))
def test_a_mistyped_variable_is_refused_with_the_closest_name(results, name):
    (wrong,) = TYPO_CASES[name][1]
    line = one_sentence(results[("typo", name)])
    assert line == f"turingbox: {wrong} is not a setting; did you mean {S.REGISTRY[name].env_name}?", line


@pytest.mark.parametrize("command", sorted(COMMAND_CASES))
def test_every_command_that_reads_settings_refuses_a_typo_first(results, command):
    line = one_sentence(results[("command", command)])
    assert line == ("turingbox: TURINGBOX_MAX_MODEL_LENGTH is not a setting; did you mean "
                    "TURINGBOX_MAX_MODEL_LEN?"), line


def test_a_name_close_to_nothing_points_at_the_listing(tmp_path):
    line = one_sentence(run(["plan"], {"TURINGBOX_ZZZ": "1"}, str(tmp_path)))
    assert line == "turingbox: TURINGBOX_ZZZ is not a setting; `turingbox settings` lists them all.", line


def test_known_names_that_are_not_settings_pass(tmp_path):
    """The plugin's and the tools' variables, and the test harness's own, are no typo."""
    env = {name: "1" for name in list(S.OTHER_VARIABLES)[:3]}
    env.update({next(iter(S.HARNESS_VARIABLES)): "x", S.HARNESS_PREFIX + "ANYTHING": "x"})
    r = run(["plan", "--json"], env, str(tmp_path))
    assert r.returncode == 0, r.stderr


def test_commands_that_read_no_setting_do_not_refuse(tmp_path):
    r = run(["settings"], {"TURINGBOX_MAX_MODEL_LENGTH": "1"}, str(tmp_path))
    assert r.returncode == 0 and "TURINGBOX_MAX_MODEL_LEN  --max-model-len" in r.stdout, r.stderr
