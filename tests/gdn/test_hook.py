"""install() decides loudly and never breaks vLLM: the mode override, a missing library and
a missing/different vLLM all return False with a reason."""

import builtins
import logging

import pytest

from turingbox_plugin.gdn import hook, library


def test_env_overrides_the_plan_mode():
    assert hook.resolve_mode("turbo", {}) == "turbo"
    assert hook.resolve_mode("turbo", {"TURINGBOX_GDN": "vllm"}) == "vllm"
    assert hook.resolve_mode(None, {"TURINGBOX_GDN": " Turbo "}) == "turbo"
    assert hook.resolve_mode(None, {}) == "vllm"
    with pytest.raises(ValueError, match="TURINGBOX_GDN must be one of turbo, vllm, not 'fast'"):
        hook.resolve_mode("turbo", {"TURINGBOX_GDN": "fast"})


def test_vllm_mode_installs_nothing(monkeypatch):
    monkeypatch.delenv("TURINGBOX_GDN", raising=False)
    assert hook.install("vllm") is False
    assert hook.last_status() == {"installed": False, "mode": "vllm",
                                  "reason": "vLLM's GDN kernels requested"}


def test_bad_env_value_is_refused(monkeypatch):
    monkeypatch.setenv("TURINGBOX_GDN", "fast")
    assert hook.install("turbo") is False
    assert "TURINGBOX_GDN must be one of" in hook.last_status()["reason"]


def test_turbo_without_library_falls_back_loudly(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("TURINGBOX_GDN", raising=False)
    missing = tmp_path / "libturingbox_gdn.so"
    monkeypatch.setenv(library.ENV_LIB, str(missing))
    with caplog.at_level(logging.WARNING, logger="turingbox.gdn"):
        assert hook.install("turbo") is False
    status = hook.last_status()
    assert status["mode"] == "turbo" and str(missing) in status["reason"]
    assert any("NOT active" in r.message for r in caplog.records)


def test_turbo_without_vllm_falls_back(monkeypatch, gdn_library):
    monkeypatch.delenv("TURINGBOX_GDN", raising=False)
    monkeypatch.setenv(library.ENV_LIB, str(gdn_library))
    real_import = builtins.__import__

    def no_vllm(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    assert hook.install("turbo") is False
    assert "cannot be imported" in hook.last_status()["reason"]
