"""Property-based fuzzing of every TURINGBOX_* setting and every flag of `turingbox plan`.

Whatever the value: exit 0 (a plan on stdout) or exit 2 with exactly one line on stderr that names
the setting, never a traceback. In-process through turingbox.cli.main for speed, plus a few real
subprocesses (plan and serve). The number of inputs tried is written to
$TURINGBOX_TEST_RELIABILITY_OUT/fuzz-counts.json when that is set.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from tests.reliability.serve_env import REPO, REPO_PYTHONPATH
from tests.support.sidecar_harness import H200, make_model_dir

from turingbox import cli, config as S
from turingbox.errors import UsageError
from turingbox.config import PLAN_SETTINGS      # the one table: REGISTRY holds every setting

ALL = sorted(S.REGISTRY)
PATHLIKE = {"model", "gpus_json", "runtime_dir", "models_dir", "plan_file", "cache_dir", "baked_cache_dir",
            "aot_triton_dir", "aot_modelinfos_dir"}
TRIED: Counter = Counter()

EDGE = ["", " ", "0", "-0", "-1", "1", "2", "3", "8", "65535", "65536", "1e309", "-1e309", "nan", "inf", "-inf",
        "0x10", "1_000", "1.5", "0.0", "1e-300", "true", "false", "yes", "no", "on", "off", "none", "null", "auto",
        "fp8", "fp8_e5m2", "bf16", "half", "FLASHINFER", "triton", "1" * 400, "½", "٣", "１", "\t3\n", "a b", "'",
        '"', "$(id)", "; rm -rf /", "%s%n", "\u202e", "🙂", "-", "--", "=", "k=v"]
VALUES = st.one_of(st.sampled_from(EDGE), st.text(max_size=30), st.integers(-10**20, 10**20).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr))




def safe_value(name: str, value: str) -> bool:
    """Paths stay relative and inside the test's working directory (the planner may create folders)."""
    if name in PATHLIKE and (value.strip().startswith(("/", "~")) or ".." in value):
        return False
    return True


@pytest.mark.parametrize("flag", ["--max-num-seqs", "--max-num-batched-tokens"])
def test_a_huge_integer_is_refused_in_one_sentence(workdir, capsys, flag):
    code, out, err = run_plan(capsys, ["plan", "--gpus-json", H200, "--model", workdir, "--json", f"{flag}={'1' * 400}"])
    assert code == 2 and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("flag", ["--model", "--gpus-json"])
def test_a_path_with_a_line_break_stays_on_one_line(workdir, capsys, flag):
    argv = ["plan", "--gpus-json", H200, "--model", workdir, "--json", f"{flag}=no\rsuch\nfile"]
    code, out, err = run_plan(capsys, argv)
    assert code == 2 and len(err.strip().splitlines()) == 1, err


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    model = make_model_dir(str(d))
    old = os.getcwd()
    os.chdir(d)
    saved = {k: v for k, v in os.environ.items() if k.startswith("TURINGBOX_")}
    for k in saved:
        del os.environ[k]
    os.environ["TURINGBOX_RUNTIME_DIR"] = str(d / "runtime")
    yield model
    os.chdir(old)
    os.environ.pop("TURINGBOX_RUNTIME_DIR", None)
    os.environ.update(saved)
    out = os.environ.get("TURINGBOX_TEST_RELIABILITY_OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "fuzz-counts.json"), "w") as f:
            json.dump({"total": sum(TRIED.values()), "by_kind": dict(TRIED)}, f, indent=1, sort_keys=True)


def run_plan(capsys, argv: list[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exc:             # argparse
        code = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    return code, out, err


def assert_clean(name: str, code: int, out: str, err: str, source: str) -> None:
    assert "Traceback" not in out + err, err
    assert code in (0, 2), (name, code, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("turingbox: "), (name, err)
        # A value the setting refuses is named; a valid one that makes the plan impossible gets the
        # planner's sentence with the numbers instead.
        assert source in lines[0] or " is invalid" not in lines[0], (name, source, err)
    else:
        plan = json.loads(out)
        assert isinstance(plan["vllm_args"], list) and plan["vllm_args"]


FUZZ = hsettings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "50")), deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                        HealthCheck.filter_too_much])


@pytest.mark.parametrize("name", sorted(PLAN_SETTINGS))
@FUZZ
@given(value=VALUES)
def test_plan_flag(workdir, capsys, name, value):
    if not safe_value(name, value):
        return
    s = S.REGISTRY[name]
    base = ["plan", "--gpus-json", H200, "--model", workdir, "--json"]
    TRIED["plan flag"] += 1
    code, out, err = run_plan(capsys, [*base, f"{s.flag_name}={value}"])
    assert_clean(name, code, out, err, s.flag_name)


@pytest.mark.parametrize("name", sorted(PLAN_SETTINGS))
@FUZZ
@given(value=VALUES)
def test_plan_env(workdir, capsys, name, value):
    if not safe_value(name, value) or "\x00" in value:       # the environment cannot hold NUL
        return
    s = S.REGISTRY[name]
    base = ["plan", "--gpus-json", H200, "--model", workdir, "--json"]
    if name in ("gpus_json", "model"):
        base = ["plan", "--json"] + (["--model", workdir] if name == "gpus_json" else ["--gpus-json", H200])
    os.environ[s.env_name] = value
    try:
        TRIED["plan env"] += 1
        code, out, err = run_plan(capsys, base)
    finally:
        del os.environ[s.env_name]
    if value.strip() == "" and code == 0:
        return                                              # empty = unset: the default
    assert_clean(name, code, out, err, s.env_name)


@pytest.mark.parametrize("name", [n for n in ALL if n not in PLAN_SETTINGS])
@FUZZ
@given(value=VALUES)
def test_every_other_setting_resolves_or_says_one_sentence(name, value):
    """Settings of serve, cache and warmup: their value parser, through the real resolver."""
    s = S.REGISTRY[name]
    TRIED["other settings env"] += 1
    try:
        S.resolve([name], environ={s.env_name: value})
    except UsageError as exc:
        text = str(exc)
        assert "\n" not in text and s.env_name in text and text.endswith("."), text
        if s.secret:
            assert value not in text or value in ("", " ", "***"), text   # a secret is never echoed


SUBPROCESS_CASES = [
    (["plan", "--max-model-len=lots"], {}, "--max-model-len"),
    (["plan"], {"TURINGBOX_GPU_MEMORY_UTILIZATION": "1.5"}, "TURINGBOX_GPU_MEMORY_UTILIZATION"),
    (["plan", "--tensor-parallel-size=3"], {}, "3"),
    (["serve"], {"TURINGBOX_PORT": "70000"}, "TURINGBOX_PORT"),
    (["serve"], {"TURINGBOX_MAX_HEADER_BYTES": "-1"}, "TURINGBOX_MAX_HEADER_BYTES"),
    (["serve"], {"TURINGBOX_API_KEY": "has space"}, "TURINGBOX_API_KEY"),
]


@pytest.mark.parametrize("argv,env,needle", SUBPROCESS_CASES)
def test_bad_input_in_a_real_process(tmp_path, argv, env, needle):
    model = make_model_dir(str(tmp_path))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TURINGBOX_")}
    full_env.update(env, PYTHONPATH=REPO_PYTHONPATH, TURINGBOX_RUNTIME_DIR=str(tmp_path / "rt"))
    r = subprocess.run([sys.executable, "-m", "turingbox", *argv, "--gpus-json", H200, "--model", model],
                       capture_output=True, text=True, env=full_env, cwd=REPO, timeout=60)
    TRIED["subprocess"] += 1
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert "has space" not in r.stderr                     # the API key's value is not echoed
