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

A hybrid model (`lamina mkmodel --preset qwen35-small`: gated-DeltaNet
layers whose recurrent state every rank keeps its part of, its heads' under
--tp, its stage's layers' under --pp; the followers replay the leader's
state-slot operations from each plan), served by mpirun -np 2 ... --tp 2 and
--pp 2 beside a single process with the same flags (-c 512, --batch-tokens
96, so prompts longer than the delta rule's 64-position chunks are split),
through plain HTTP:
  - three greedy requests at once (slots acquired and released beside each
    other) and n = 2 (the fork copies the prompt's state on every rank):
    the single process's texts; under --pp also their log-probabilities to
    the bit, and n = 2 sampled with a seed;
  - a shared system prompt, one question after another (snapshots saved and
    restored on every rank): the texts the single process gives, mostly
    cached from the third request on, lamina_state_snapshots_restored_total
    grows;
  - speculation by prompt lookup (--spec ngram: verification segments with
    checkpoints, rolled back on every rank) on a repetitive prompt: the
    single process's greedy texts, and proposals were accepted and states
    rolled back (lamina_spec_accepted_tokens_total,
    lamina_spec_state_rollbacks_total) as often as on the single process;
  - a KV pool too small for three requests' growth (--kv-mem): requests
    are preempted (their slots released, taken again on readmission) and
    get the texts they get alone.
Under --tp the all-reduce adds the ranks' parts in another order than one
process sums a row, so the texts are compared, not the log-probabilities.
Skipped, saying why, when the MPI binary or mpirun is absent.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_server import openai_python  # noqa: E402 (the venv with the openai client)
import e2e_server as es  # noqa: E402 (post, metrics, wait_idle)
import testenv  # noqa: E402
from testenv import result, skip, summary  # noqa: E402

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
LAMINA_MPI = os.path.join(os.path.dirname(LAMINA), "mpi", "lamina")
MODEL = "models/stories260K.gguf"
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1",
           ASAN_OPTIONS=(os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":"))
os.environ.update(ENV)  # testenv.Server starts mpirun with this process's environment
N_CHECKS = 12
N_HYBRID = 3 + 2 * 13
VOCAB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "vocab", "ggml-vocab-gpt-2.gguf")
BASE = ("Once upon a time there was a little girl named Lily. She liked to play in the park with her dog. "
        "One day she saw a big red ball under a tree and ran to get it. ")
PROMPTS = [BASE * 2, "The capital of France is Paris. " * 9 + BASE, "def fibonacci(n):\n    return n\n" * 12]
SYSTEM = ("You are a helpful assistant for a small town library. You answer questions about opening hours, "
          "books, events and the rules of the reading room. Be brief and friendly. ") * 4
QUESTIONS = ["Q: When does the library open on Sundays?\nA:", "Q: Can I bring my dog inside?\nA:",
             "Q: How many books may I borrow at once?\nA:", "Q: Is there a reading group for children?\nA:"]
# prompt lookup on a random model: a grammar that allows only a repeating text gets guesses
# accepted, a repetitive prompt without one gets them rejected (the state rolled back)
SPEC = [("ab" * 20, {"grammar": 'root ::= ("ab")+'}),
        ("The cat sat on the mat. The dog sat on the log. " * 4 + "The cat sat", {}),
        ("one two three four five six seven eight nine ten " * 5 + "one two three", {}),
        ("The cat sat on the mat. " * 3, {"grammar": 'root ::= ("The cat sat on the mat. ")+'})]


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

def ask(srv, prompt, n=1, n_gen=24, seed=None, usage=None, extra=None):
    """A request's choices as (text, token log-probabilities), greedy unless seeded."""
    body = {"prompt": prompt, "max_tokens": n_gen, "temperature": 0, "n": n, "ignore_eos": True, "logprobs": 1}
    body.update(extra or {})
    if seed is not None:
        body.update({"temperature": 0.9, "top_p": 1, "seed": seed})
    st, _, data = es.post(srv, "/v1/completions", body, timeout=300)
    if st != 200:
        return [("status %d: %r" % (st, data[:300]), None)] * n
    d = json.loads(data)
    if usage is not None:
        usage.update(d.get("usage", {}))
    return [(c["text"], c["logprobs"]["token_logprobs"]) for c in sorted(d["choices"], key=lambda c: c["index"])]


def hybrid_session(srv):
    """Everything the hybrid checks ask of one server (the same calls on each)."""
    out = {"alone": [ask(srv, p)[0] for p in PROMPTS]}
    got = [None] * len(PROMPTS)

    def one(i):
        got[i] = ask(srv, PROMPTS[i])[0]

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    [t.start() for t in ts]
    [t.join() for t in ts]
    out["at_once"] = got
    out["n2"] = ask(srv, PROMPTS[0], n=2)
    out["n2_seed"] = ask(srv, PROMPTS[1], n=2, seed=5)
    m0 = es.metrics(srv)
    shared, cached = [], []
    for q in QUESTIONS:
        u = {}
        shared.append(ask(srv, SYSTEM + q, usage=u)[0])
        cached.append(((u.get("prompt_tokens_details") or {}).get("cached_tokens", -1), u.get("prompt_tokens", 0)))
    m1 = es.metrics(srv)
    out["shared"], out["cached"] = shared, cached
    out["restored"] = m1.get("lamina_state_snapshots_restored_total", 0) - \
        m0.get("lamina_state_snapshots_restored_total", 0)
    out["spec"] = [ask(srv, p, n_gen=40, extra=x)[0] for p, x in SPEC]
    m2 = es.metrics(srv)
    out["spec_moved"] = [m2.get(k, 0) - m1.get(k, 0) for k in ("lamina_spec_state_rollbacks_total",
                                                                "lamina_spec_accepted_tokens_total")]
    out["idle"] = es.wait_idle(srv, 60)[0]
    return out


def preempted(what, flags, flag, same):
    """A KV pool too small for three prompts' growth (as e2e_engine_hybrid.py's: 14 blocks of
    16 positions, 2048 bytes each): preempted requests release their state slots and start
    again from a fresh one on every rank, and get the texts they get alone."""
    try:
        srv = testenv.Server(["mpirun", "--oversubscribe", "-np", "2", LAMINA_MPI, "serve", *flags, flag, "2"],
                             start_timeout=180)
    except RuntimeError as e:
        result("%s, small KV pool: server starts" % what, False, str(e)[-2000:])
        return
    try:
        alone = [ask(srv, p, n_gen=48)[0] for p in PROMPTS]
        p0 = es.metrics(srv).get("lamina_preemptions_total", 0)
        # one request of the three prompts: they arrive together, so they run together
        got = ask(srv, PROMPTS, n_gen=48)
        p1 = es.metrics(srv).get("lamina_preemptions_total", 0)
        result("%s, small KV pool: three at once, preempted, the texts alone" % what,
               same(got, alone) and all(t[0] for t in alone) and p1 > p0, (p0, p1, got, alone))
    finally:
        ended = testenv.terminate(srv, what + ", small KV pool")
        if ended:
            result("%s, small KV pool: no rank reports an error" % what,
                   not re.search(r"rank \d+:|Sanitizer|runtime error:", ended[1]), ended[1][-3000:])


def check_hybrid(tmp):
    """qwen35-small served over 2 ranks (--tp 2, --pp 2) against one process."""
    if not os.access(LAMINA_MPI, os.X_OK) or not shutil.which("mpirun"):
        skip("mpi serve hybrid", "no %s or no mpirun (make mpi)" % LAMINA_MPI, N_HYBRID)
        return
    model = os.path.join(tmp, "qwen35_mpi.%d.gguf" % os.getpid())
    r = subprocess.run([LAMINA, "mkmodel", "--preset", "qwen35-small", "--type", "F16", "--vocab-from", VOCAB,
                        "-o", model], capture_output=True)
    result("mkmodel qwen35-small", r.returncode == 0, r.stderr.decode()[-400:])
    if r.returncode:
        return
    flags = ["-m", model, "-t", "1", "-c", "512", "--kv-type", "F16", "--batch-tokens", "96", "--max-seqs", "4",
             "--state-snapshots", "8", "--spec", "ngram", "--draft-max", "4", "--spec-widths", "1:1,64:1"]
    try:
        one = testenv.Server([LAMINA, "serve", *flags])
        try:
            ref = hybrid_session(one)
        finally:
            one.stop("hybrid single process")
        result("hybrid single process: texts, a prefix hit, guesses accepted and rolled back",
               all(t[0] for t in ref["alone"]) and ref["restored"] > 0 and min(ref["spec_moved"]) > 0, ref)
        for flag in ("--tp", "--pp"):
            what = "hybrid " + flag + " 2"
            try:
                srv = testenv.Server(["mpirun", "--oversubscribe", "-np", "2", LAMINA_MPI, "serve", *flags, flag,
                                      "2"], start_timeout=180)
            except RuntimeError as e:
                result("%s: server starts" % what, False, str(e)[-2000:])
                continue
            try:
                got = hybrid_session(srv)
            finally:
                # mpirun's status after SIGTERM is not 0: the job must end, no rank with an error
                ended = testenv.terminate(srv, what)
                if ended:
                    result("%s: SIGTERM ends the job, no rank reports an error" % what,
                           not re.search(r"rank \d+:|Sanitizer|runtime error:", ended[1]), ended[1][-3000:])
            exact = flag == "--pp"  # --tp: another order of additions, compare texts only
            def same(a, b):
                return a == b if exact else [x[0] for x in a] == [x[0] for x in b]
            result("%s: each prompt alone, the single process's text" % what, same(got["alone"], ref["alone"]),
                   (got["alone"], ref["alone"]))
            result("%s: three at once, the texts alone" % what, same(got["at_once"], got["alone"]) and
                   same(got["at_once"], ref["alone"]), got["at_once"])
            result("%s: n = 2, both choices the text alone" % what, same(got["n2"], [got["alone"][0]] * 2), got["n2"])
            result("%s: n = 2 with a seed: the single process's choices" % what,
                   not exact or got["n2_seed"] == ref["n2_seed"], (got["n2_seed"], ref["n2_seed"]))
            result("%s: shared system prompt, the single process's texts" % what, same(got["shared"], ref["shared"]),
                   (got["shared"], ref["shared"]))
            result("%s: shared system prompt, mostly cached from the third request on" % what,
                   all(c > n // 2 for c, n in got["cached"][2:]) and got["cached"] == ref["cached"], got["cached"])
            result("%s: snapshots restored on the prefix hits" % what, got["restored"] > 0, got["restored"])
            result("%s: speculation (prompt lookup), the single process's texts" % what,
                   same(got["spec"], ref["spec"]), (got["spec"], ref["spec"]))
            result("%s: speculation: guesses accepted, states rolled back" % what,
                   got["spec_moved"][0] > 0 and got["spec_moved"][1] > 0 and got["spec_moved"] == ref["spec_moved"],
                   (got["spec_moved"], ref["spec_moved"]))
            result("%s: idle after" % what, got["idle"], got["idle"])
            preempted(what, flags + ["--kv-mem", str(14 * 16 * 2048)], flag, same)
    finally:
        try:
            os.unlink(model)
        except OSError:
            pass


def main():
    check_tp_server()
    check_hybrid(os.environ.get("TMPDIR", "/tmp"))
    return summary()


if __name__ == "__main__":
    sys.exit(main())
