#!/usr/bin/env python3
"""`lamina serve` under tensor and under pipeline parallelism: mpirun
--oversubscribe -np 2 $BUILD/mpi/lamina serve ... --tp 2, then --pp 2
(stage 0 on rank 0 with the engine, the last stage's logits broadcast
back to it), each on the bundled model, against a
single-process `lamina serve` of the default build, through the official
`openai` Python client (the venv e2e_server.py installs from PyPI under
$LAMINA_CACHE; when it cannot be installed these checks count as skipped).

  - a greedy completion of 48 tokens: the same text as the single process
    (the bundled model's greedy tokens agree under TP, see e2e_mpi.sh);
  - n=2 with a seed (forks share the prompt's KV blocks; the follower rank
    repeats the leader's copy-on-write copies): both choices complete with
    their full length;
  - a chat-less streamed completion arrives in pieces and ends with a
    finish_reason;
  - four concurrent requests (one batch of several sequences, their block
    tables broadcast each iteration): all answered, greedy ones identical to
    the single process;
  - SIGTERM to mpirun: the whole job ends (rank 0 tells the follower to
    stop), within the timeout.
Under --pp the pipelined passes cut each batch into micro-batches (rows
of several sequences or chunks of one); a row's arithmetic does not depend
on its micro-batch, so the texts must equal the single process's exactly.
Skipped, saying why, when the MPI binary or mpirun is absent.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_server import openai_python  # noqa: E402 (the venv with the openai client)
from testenv import result, skip, summary  # noqa: E402

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
LAMINA_MPI = os.path.join(os.path.dirname(LAMINA), "mpi", "lamina")
MODEL = "models/stories260K.gguf"
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1",
           ASAN_OPTIONS=(os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":"))
N_CHECKS = 12


def start(cmd, log):
    f = open(log, "w")
    p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=ENV, start_new_session=True)
    deadline = time.time() + 120
    port = None
    while time.time() < deadline and p.poll() is None:
        text = open(log).read()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
        if m:
            port = int(m.group(1))
        if port and "ready in" in text:
            return p, port
        time.sleep(0.2)
    return p, None


CLIENT = r'''
import json, sys, threading
import openai
cfg = json.loads(sys.argv[1])
out = {}
for name, port in (("tp", cfg["tp"]), ("one", cfg["one"])):
    c = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="unused", max_retries=0, timeout=120)
    r = c.completions.create(model=cfg["model"], prompt="Once upon a time", max_tokens=48, temperature=0)
    out[name + "_greedy"] = r.choices[0].text
    r = c.completions.create(model=cfg["model"], prompt="Once upon a time", max_tokens=24, temperature=0.9,
                             seed=5, n=2)
    out[name + "_n2"] = [[ch.text, ch.finish_reason] for ch in r.choices] + [r.usage.completion_tokens]
    parts = []
    fin = None
    for ev in c.completions.create(model=cfg["model"], prompt="The little dog", max_tokens=20, temperature=0,
                                   stream=True):
        if ev.choices:
            parts.append(ev.choices[0].text)
            fin = ev.choices[0].finish_reason or fin
    out[name + "_stream"] = [len(parts), "".join(parts), fin]
    res = [None] * 4
    def one(i):
        r = c.completions.create(model=cfg["model"], prompt=["Once upon a time", "The cat", "Tim and Sue",
                                 "One day"][i], max_tokens=32, temperature=0)
        res[i] = r.choices[0].text
    th = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    [t.start() for t in th]
    [t.join() for t in th]
    out[name + "_concurrent"] = res
print(json.dumps(out))
'''


def run_mode(py, flag, one_port, log_one, tmp):
    """The checks against the single process (one_port) for `flag 2` (--tp
    or --pp) on 2 ranks; True when the server or client could not run."""
    what = flag + " 2"
    log_tp = os.path.join(tmp, "lamina_mpi_%s.%d.log" % (flag[2:], os.getpid()))
    tp, tp_port = start(["mpirun", "--oversubscribe", "-np", "2", LAMINA_MPI, "serve", "-m", MODEL, "--port", "0",
                         "-t", "1", flag, "2"], log_tp)
    try:
        if not tp_port or not one_port:
            result("servers start (%s)" % what, False, open(log_tp).read()[-1500:] + open(log_one).read()[-500:])
            return True
        r = subprocess.run([py, "-c", CLIENT, json.dumps({"tp": tp_port, "one": one_port,
                                                          "model": "stories260K.gguf"})],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            result("openai client under %s" % what, False, r.stderr[-1500:] + open(log_tp).read()[-1500:])
            return True
        o = json.loads(r.stdout)
        result("%s: greedy completion equals the single process" % what, o["tp_greedy"] == o["one_greedy"] and
               len(o["tp_greedy"]) > 20, (o["tp_greedy"], o["one_greedy"]))
        result("%s: n=2 with a seed: both choices at full length" % what, len(o["tp_n2"]) == 3 and
               o["tp_n2"][2] == 48 and all(ch[1] == "length" and ch[0] for ch in o["tp_n2"][:2]), o["tp_n2"])
        result("%s: n=2: the same choices as the single process" % what, o["tp_n2"] == o["one_n2"],
               (o["tp_n2"], o["one_n2"]))
        result("%s: stream arrives in pieces and ends" % what, o["tp_stream"][0] >= 10 and
               o["tp_stream"][2] == "length" and o["tp_stream"][1] == o["one_stream"][1],
               (o["tp_stream"], o["one_stream"]))
        result("%s: four concurrent requests equal the single process" % what,
               o["tp_concurrent"] == o["one_concurrent"] and all(o["tp_concurrent"]),
               (o["tp_concurrent"], o["one_concurrent"]))
    finally:
        t0 = time.time()
        if tp.poll() is None:
            os.killpg(tp.pid, signal.SIGTERM)
        try:
            tp.wait(timeout=60)
            result("SIGTERM ends the whole %s job" % what, True)
            print("NOTE the %s job ended %.1f s after SIGTERM (exit %d)" % (what, time.time() - t0, tp.returncode))
        except subprocess.TimeoutExpired:
            os.killpg(tp.pid, signal.SIGKILL)
            result("SIGTERM ends the whole %s job" % what, False, "still running after 60 s")
        try:
            os.unlink(log_tp)
        except OSError:
            pass
    return False


def check_tp_server():
    if not os.access(LAMINA_MPI, os.X_OK) or not shutil.which("mpirun"):
        skip("mpi serve", "no %s or no mpirun (make mpi; scripts/deps.sh installs Open MPI)" % LAMINA_MPI, N_CHECKS)
        return
    py, why = openai_python()
    if not py:
        skip("mpi serve", why, N_CHECKS)
        return
    tmp = os.environ.get("TMPDIR", "/tmp")
    log_one = os.path.join(tmp, "lamina_mpi_one.%d.log" % os.getpid())
    one, one_port = start([LAMINA, "serve", "-m", MODEL, "--port", "0", "-t", "1"], log_one)
    try:
        for flag in ("--tp", "--pp"):
            if run_mode(py, flag, one_port, log_one, tmp):
                break
    finally:
        if one.poll() is None:
            os.killpg(one.pid, signal.SIGTERM)
        try:
            one.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(one.pid, signal.SIGKILL)
        try:
            os.unlink(log_one)
        except OSError:
            pass

def main():
    check_tp_server()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
