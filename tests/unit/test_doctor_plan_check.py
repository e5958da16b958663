"""The appliance adds its plan line to the plugin's doctor through an entry point (the plugin imports
nothing of the appliance): installed together, `turingbox doctor MODEL` plans for the machine."""
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points


def test_the_appliance_registers_its_plan_check():
    eps = {ep.name: ep.value for ep in entry_points(group="turingbox_plugin.doctor_checks")}
    assert eps.get("plan") == "turingbox.plan.doctor_check:check_plan"


def test_doctor_plan_line_is_the_planners_sentence_without_gpus(tmp_path):
    from turingbox_plugin.doctor import FAIL, WARN
    from turingbox.plan.doctor_check import check_plan

    assert check_plan(None).status == WARN
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURINGBOX_")}
    r = subprocess.run([sys.executable, "-m", "turingbox", "doctor", "--json", str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=300)
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    # an empty model directory and no GPU here: the plan line is one sentence, never a traceback
    assert checks["plan"]["status"] == FAIL and "Traceback" not in r.stderr
    assert checks["plan"]["detail"] and "\n" not in checks["plan"]["detail"]
