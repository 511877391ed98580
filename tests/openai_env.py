"""openai_env.py - what the end-to-end tests that drive `lamina serve`
through the official `openai` Python client share (e2e_tools.py,
e2e_reasoning.py, and through them e2e_tools_gemma3.py, e2e_smollm2.py):

  client_python()   the Python of $LAMINA_CACHE/venv-openai, with openai,
                    pydantic and jsonschema (installed from PyPI on first
                    use, pip's progress on testenv.install_out()), or
                    (None, why);
  Server            `lamina serve -m MODEL -t 1 ARGS...` on a free port,
                    with base() (its /v1 address) and metric(name);
  CLIENT_HEAD       the head of a client script run by that Python: cfg
                    (its one JSON argument), client (openai.OpenAI on
                    cfg["base"], no retries), TAG (cfg["tag"]) and
                    check(name, ok, detail), which prints "PASS TAG: name"
                    or "FAIL TAG: name" and the detail indented;
  run_script()      runs such a script and counts each PASS/FAIL line it
                    prints as a check of this process (testenv.result),
                    prints its detail and NOTE lines, and counts a failed
                    "TAG: client ran" when it exits non-zero or reports no
                    check; returns the number of checks.
"""
import json
import os
import subprocess
import sys

import testenv
from testenv import CACHE, install_out, result

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")


def client_python():
    """The venv's python with openai, pydantic and jsonschema, or None with why."""
    venv = os.path.join(CACHE, "venv-openai")
    py = os.path.join(venv, "bin", "python3")
    probe = [py, "-c", "import openai, pydantic, jsonschema"]
    try:
        if not os.path.exists(py):
            os.makedirs(CACHE, exist_ok=True)
            subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True, timeout=300)
        if subprocess.run(probe, capture_output=True, timeout=120).returncode != 0:
            out = install_out()
            os.write(out, ("installing openai and jsonschema from PyPI into %s\n" % venv).encode())
            subprocess.run([py, "-m", "pip", "install", "--progress-bar", "on", "openai", "jsonschema"], check=True,
                           stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=900)
            subprocess.run(probe, check=True, capture_output=True, timeout=120)
        return py, None
    except (subprocess.SubprocessError, OSError) as e:
        return None, str(e)


class Server(testenv.Server):
    def __init__(self, model, *args):
        super().__init__([LAMINA, "serve", "-m", model, "-t", "1", *args])

    def base(self):
        return "http://127.0.0.1:%d/v1" % self.port

    def metric(self, name):
        return self.metrics().get(name)


CLIENT_HEAD = r'''
import json, sys
import openai
cfg = json.loads(sys.argv[1])
client = openai.OpenAI(base_url=cfg["base"], api_key="unused", max_retries=0, timeout=600)
TAG = cfg["tag"]

def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + TAG + ": " + name)
    if not ok:
        print("  " + str(detail)[:3000])
    sys.stdout.flush()
'''


def run_script(py, script, cfg, timeout):
    """Runs CLIENT_HEAD + script with cfg; its checks counted here."""
    r = subprocess.run([py, "-c", CLIENT_HEAD + script, json.dumps(cfg)], capture_output=True, text=True,
                       timeout=timeout)
    n = 0
    for line in r.stdout.splitlines():
        if line.startswith("PASS ") or line.startswith("FAIL "):
            n += 1
            result(line[5:], line.startswith("PASS"))
        elif line.startswith("  ") or line.startswith("NOTE "):
            print(line)
    if r.returncode != 0 or n == 0:
        result("%s: client ran" % cfg["tag"], False, r.stderr[-3000:])
    return n
