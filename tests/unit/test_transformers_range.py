"""The low end of the transformers range: a fresh `pip install vllm==0.21.0` resolves transformers 4.57.x,
whose TikTokenConverter names its keyword `additional_special_tokens` (5.x: `extra_special_tokens`). The demo
model's tokenizer must build with both; the installed 5.x is covered by every other demo-model test."""
import os
import subprocess
import sys

import pytest

LOW_END = "transformers==4.57.6"


def test_demo_tokenizer_builds_with_transformers_4_57(tmp_path):
    # A venv that sees this environment's packages behind its own (a .pth, since --system-site-packages
    # would see the base interpreter's, not this venv's): pip puts only transformers 4.57 and what it
    # pins differently in front.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    inner = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(inner, "outer-environment.pth"), "w") as f:
        # site.addsitedir, not bare paths: the editable installs are .pth finders in those directories
        outer = [p for p in sys.path if p.endswith("-packages")]
        f.write(f"import site; list(map(site.addsitedir, {outer!r}))\n")
    pip = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", LOW_END],
                         capture_output=True, text=True, timeout=600)
    if pip.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"pip install {LOW_END} failed: {pip.stderr[-2000:]}")
        pytest.skip(f"{LOW_END} not installable here (no package index?)")
    version = subprocess.run([py, "-c", "import transformers; print(transformers.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version.startswith("4.57."), version
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURINGBOX_")}
    env.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "home" / ".cache"))
    out = tmp_path / "demo"
    r = subprocess.run([py, "-m", "turingbox", "demo-model", str(out), "--layers", "4"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    # the specials landed on the package's ids (build_backend_tokenizer checks them and raises otherwise)
    check = ("import sys; from tokenizers import Tokenizer; t = Tokenizer.from_file(sys.argv[1]); "
             "print(t.token_to_id('<|im_start|>'), t.token_to_id('<|im_end|>'))")
    ids = subprocess.run([py, "-c", check, str(out / "tokenizer.json")], capture_output=True, text=True,
                         check=True).stdout.split()
    from turingbox.model.tokenizer import special_tokens
    specials = special_tokens()
    assert ids == [str(specials["<|im_start|>"]), str(specials["<|im_end|>"])]
