"""Every test starts from the same environment, whatever the caller exported: the appliance's settings
(TURINGBOX_*) and the stand-in vLLM's knobs (FAKE_VLLM_*) are dropped once, at collection, so a
developer's `export TURINGBOX_MTP=0` cannot change a planner assertion. Tests set what they need.
Kept: the test harness's own inputs (TURINGBOX_TEST_*, TURINGBOX_BAKE_TEST_IMAGE, TURINGBOX_VLLM_SRC)."""
import os

_KEEP = ("TURINGBOX_TEST_", "TURINGBOX_BAKE_TEST_IMAGE", "TURINGBOX_VLLM_SRC")
for _name in [n for n in os.environ if n.startswith(("TURINGBOX_", "FAKE_VLLM_")) and not n.startswith(_KEEP)]:
    del os.environ[_name]
