"""install() decides loudly and never breaks vLLM: the mode override, a missing library and
a missing/different vLLM all return False with a reason."""

import builtins
import logging

import pytest

from turingbox_plugin.gdn import hook, library


def test_mode_is_the_resolved_argument_never_the_environment(monkeypatch):
    """The plugin resolves TURINGBOX_GDN once (activation.resolve_settings); the hook must not re-read it."""
    assert hook.check_mode("turbo") == "turbo"
    assert hook.check_mode(" Turbo ") == "turbo"
    assert hook.check_mode(None) == "vllm"
    monkeypatch.setenv("TURINGBOX_GDN", "vllm")
    assert hook.check_mode("turbo") == "turbo"
    with pytest.raises(ValueError, match="gdn mode must be one of turbo, vllm, not 'fast'"):
        hook.check_mode("fast")


def test_vllm_mode_installs_nothing(monkeypatch):
    monkeypatch.delenv("TURINGBOX_GDN", raising=False)
    assert hook.install("vllm") is False
    assert hook.last_status() == {"installed": False, "mode": "vllm",
                                  "reason": "vLLM's GDN kernels requested"}


def test_bad_mode_is_refused():
    assert hook.install("fast") is False
    assert "gdn mode must be one of" in hook.last_status()["reason"]


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
