#!/usr/bin/env python3
"""Embeddings throughput: `lamina serve` against `llama-server --embeddings`, same file, same pooling.

Both servers are started here on the same GGUF, with the same threads, and left running; the
workloads then run on one server at a time, interleaved (lamina, llama-server, lamina, ...) for
--rounds rounds, so a loaded machine weighs on both alike. Each workload embeds N short texts
(8 to 16 words, fixed by a seed):

  batch1   one input per request, one client, sequential
  batched  --per-request inputs per request, --clients concurrent clients

and reports inputs per second (every round's, and their median). Before timing, both servers
embed the same 8 texts and the cosines of their vectors are printed (they compute the same thing).
Standard library only.

    python3 bench/embed_load.py -m qwen3-embedding-small-F16.gguf -t 2 --rounds 3
    python3 bench/embed_load.py -m models/stories260K.gguf --pooling mean
    python3 bench/embed_load.py -m M --llama-args "--poll 0"    # llama.cpp's workers sleep, not spin
"""
import argparse
import http.client
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time

from serve_common import free_port

WORDS = ("the a of and to in is was that it for on with as his he at by from they this had not are but be "
         "story river mountain light city morning garden letter window music engine bridge winter school "
         "cat dog house tree road blue green small quiet bright").split()


def texts(n, seed=1):
    rnd = random.Random(seed)
    return [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(8, 16))) for _ in range(n)]


def post(port, body, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/v1/embeddings", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError("HTTP %d: %s" % (r.status, data[:300]))
        return json.loads(data)
    finally:
        c.close()


def wait_health(port, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the server exited (%s)" % proc.returncode)
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server on port %d never got healthy" % port)


def run_batch1(port, inputs):
    t0 = time.monotonic()
    for t in inputs:
        post(port, {"input": t})
    return len(inputs) / (time.monotonic() - t0)


def run_batched(port, inputs, per_request, clients):
    chunks = [inputs[i:i + per_request] for i in range(0, len(inputs), per_request)]
    lock = threading.Lock()
    errors = []

    def worker():
        while True:
            with lock:
                if not chunks:
                    return
                ch = chunks.pop()
            try:
                r = post(port, {"input": ch})
                if len(r["data"]) != len(ch):
                    raise RuntimeError("%d vectors for %d inputs" % (len(r["data"]), len(ch)))
            except Exception as e:  # noqa: BLE001 (reported below)
                with lock:
                    errors.append(e)
                return

    t0 = time.monotonic()
    th = [threading.Thread(target=worker) for _ in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    if errors:
        raise errors[0]
    return len(inputs) / (time.monotonic() - t0)


def cos(u, v):
    return sum(a * b for a, b in zip(u, v)) / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--pooling", default=None, help="mean|cls|last for both (default: the file's)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--inputs", type=int, default=1000)
    ap.add_argument("--per-request", type=int, default=32)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=512, help="positions per sequence (both servers)")
    ap.add_argument("--lamina", default="build/lamina")
    ap.add_argument("--llama-server", default="/work/llama.cpp/build/bin/llama-server")
    ap.add_argument("--llama-args", default="", help="more llama-server options (e.g. '--poll 0' on a loaded host)")
    a = ap.parse_args()

    lp, cp = free_port(), free_port()
    pool = ["--pooling", a.pooling] if a.pooling else []
    lam_cmd = [a.lamina, "serve", "-m", a.model, "-t", str(a.threads), "-c", str(a.ctx), "--port", str(lp),
               "--max-seqs", "64", "--batch-tokens", "512", *pool]
    # llama-server: the same context per slot, 8 slots, one 512-token batch
    cpp_cmd = [a.llama_server, "-m", a.model, "--embeddings", "-t", str(a.threads), "-np", "8", "-c",
               str(8 * a.ctx), "-b", "512", "-ub", "512", "--port", str(cp), *pool, *a.llama_args.split()]
    print("lamina:       " + " ".join(lam_cmd))
    print("llama-server: " + " ".join(cpp_cmd))
    procs = []
    try:
        for cmd in (lam_cmd, cpp_cmd):
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_health(lp, procs[0])
        wait_health(cp, procs[1])
        probe = texts(8, seed=7)
        a_v = [d["embedding"] for d in post(lp, {"input": probe})["data"]]
        b_v = [d["embedding"] for d in post(cp, {"input": probe})["data"]]
        cs = [cos(u, v) for u, v in zip(a_v, b_v)]
        print("agreement: cosine of lamina's and llama-server's vectors, 8 texts: min %.7f" % min(cs))
        inputs = texts(a.inputs)
        post(lp, {"input": inputs[:16]})  # warm both
        post(cp, {"input": inputs[:16]})
        res = {(e, w): [] for e in ("lamina", "llama-server") for w in ("batch1", "batched")}
        for r in range(a.rounds):
            for w in ("batch1", "batched"):
                for eng, port in (("lamina", lp), ("llama-server", cp)) if r % 2 == 0 else \
                        (("llama-server", cp), ("lamina", lp)):
                    load = os.getloadavg()[0]
                    if w == "batch1":
                        v = run_batch1(port, inputs)
                    else:
                        v = run_batched(port, inputs, a.per_request, a.clients)
                    res[(eng, w)].append(v)
                    print("round %d %-8s %-13s %8.1f inputs/s  (load %.2f)" % (r + 1, w, eng, v, load))
                    sys.stdout.flush()
        print()
        print("| workload | lamina inputs/s | llama-server inputs/s | ratio |")
        print("| --- | ---: | ---: | ---: |")
        for w, name in (("batch1", "batch 1, sequential"),
                        ("batched", "%d per request, %d clients" % (a.per_request, a.clients))):
            x, y = statistics.median(res[("lamina", w)]), statistics.median(res[("llama-server", w)])
            print("| %s | %.1f | %.1f | %.2f |" % (name, x, y, x / y))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
