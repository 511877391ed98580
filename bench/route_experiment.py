#!/usr/bin/env python3
"""The router experiment of bench/results/router.md: does concurrency reach the engines?

Runs the same workload (R requests from C concurrent streaming clients, the
bundled model, greedy, EOS ignored) against:
  direct        one `lamina serve` replica, clients talking to it directly
  router-1      `lamina route --spawn K` with --max-inflight-per-replica 1
  router-learnt `lamina route --spawn K` with limits learnt from /metrics
for K = 1 and 2 replicas (each replica with -t 1), one replica with -t 2
(2 replicas against 1 on the same two cores), then the 8-shared-system-prompts workload through
2 replicas with --policy prefix-affinity and round-robin. For each: request
throughput, TTFT, the engines' mean batch (from their /metrics), the
replicas' prefix-cache hit rate, and `lamina trace`'s summary of the
router's trace. Prints a Markdown table and the trace summaries.

    python3 bench/route_experiment.py [--requests 128 --clients 64 --max-tokens 64]
"""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_load import WORDS, one_request, pct  # noqa: E402

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
MODEL = "models/stories260K.gguf"
SERVE = ["-t", "1", "-c", "512", "--ctx-extend"]
NAME = os.path.basename(MODEL)


def start(args, pattern):
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines, port, reps = [], [None], []
    got = threading.Event()

    def reader():
        for raw in p.stderr:
            line = raw.decode("utf-8", "replace")
            lines.append(line)
            m = re.search(r"replica \d+ pid \d+ at (http://\S+)", line)
            if m:
                reps.append(m.group(1))
            m = re.search(pattern, line)
            if m:
                port[0] = int(m.group(1))
                got.set()
        got.set()

    threading.Thread(target=reader, daemon=True).start()
    got.wait(60)
    base = "http://127.0.0.1:%d" % port[0]
    for _ in range(600):
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                body = json.loads(r.read())
                if r.status == 200 and body.get("replicas_healthy", 1) == max(1, len(reps)):
                    break
        except OSError:
            pass
        time.sleep(0.05)
    return p, base, reps or [base]


def metrics(url):
    out = {}
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
    return out


def run_load(base, prompts, clients, max_tokens):
    todo = list(range(len(prompts)))
    res, errs, lock = [], [], threading.Lock()
    host, port = base[7:].split(":")

    def client():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            try:
                r = one_request(host, int(port), "", prompts[i], max_tokens, NAME)
                with lock:
                    res.append(r)
            except Exception as e:  # noqa: BLE001 - every failure counts
                with lock:
                    errs.append(str(e))

    t0 = time.monotonic()
    th = [threading.Thread(target=client) for _ in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.monotonic() - t0
    ttft = [r["times"][0] - r["t0"] for r in res if r["times"]]
    return {"rps": len(res) / wall, "tps": sum(r["n_out"] for r in res) / wall, "ttft": ttft, "errors": len(errs),
            "wall": wall}


def experiment(name, kind, n_rep, extra, prompts, a, serve=None):
    serve = serve or SERVE
    trace = None
    if kind == "direct":
        p, base, reps = start([LAMINA, "serve", "-m", MODEL, "--port", "0", *serve],
                              r"listening on http://127\.0\.0\.1:(\d+)")
    else:
        trace = tempfile.mktemp(suffix=".trace")
        p, base, reps = start([LAMINA, "route", "--spawn", str(n_rep), "-m", MODEL, "--port", "0", "--trace", trace,
                               "--poll-interval", "0.05", *extra, "--", *serve],
                              r"lamina route: listening on http://127\.0\.0\.1:(\d+)")
    before = [metrics(u) for u in reps]
    r = run_load(base, prompts, a.clients, a.max_tokens)
    after = [metrics(u) for u in reps]
    bs = sum(x.get("lamina_batch_size_sum", 0) - y.get("lamina_batch_size_sum", 0) for x, y in zip(after, before))
    bc = sum(x.get("lamina_batch_size_count", 0) - y.get("lamina_batch_size_count", 0) for x, y in zip(after, before))
    hq = sum(x.get("lamina_prefix_cache_queries_total", 0) - y.get("lamina_prefix_cache_queries_total", 0)
             for x, y in zip(after, before))
    hh = sum(x.get("lamina_prefix_cache_hits_total", 0) - y.get("lamina_prefix_cache_hits_total", 0)
             for x, y in zip(after, before))
    p.terminate()
    p.wait(60)
    summary = ""
    if trace:
        summary = subprocess.run([LAMINA, "trace", trace, "--svg", os.devnull], capture_output=True,
                                 text=True).stdout
        os.unlink(trace)
    row = "| %s | %d | %.1f | %.0f | %.0f | %.0f | %.2f | %.2f | %d |" % (
        name, n_rep, r["rps"], r["tps"], statistics.mean(r["ttft"]) * 1e3, pct(r["ttft"], 0.9) * 1e3,
        bs / bc if bc else 0, hh / hq if hq else 0, r["errors"])
    print(row, flush=True)
    return row, summary


def main():
    global MODEL, NAME
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=48)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--serve-args", default=" ".join(SERVE), help="options of each `lamina serve`")
    ap.add_argument("--only", default="", help="comma-separated parts: admission, affinity")
    a = ap.parse_args()
    MODEL, NAME = a.model, os.path.basename(a.model)
    SERVE[:] = a.serve_args.split()
    rng = random.Random(1)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(a.prompt_words)) for _ in range(a.requests)]
    systems = [" ".join(rng.choice(WORDS) for _ in range(64)) for _ in range(8)]
    shared = [systems[i % 8] + " " + " ".join(rng.choice(WORDS) for _ in range(8)) for i in range(a.requests)]
    print("| setup | replicas | req/s | output tok/s | TTFT mean ms | TTFT p90 ms | engine mean batch | "
          "prefix blocks reused per request | errors |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    runs = [("direct to one replica", "direct", 1, []),
            ("router, 1 in flight per replica", "route", 1, ["--max-inflight-per-replica", "1"]),
            ("router, learnt admission", "route", 1, []),
            ("router, 1 in flight per replica", "route", 2, ["--max-inflight-per-replica", "1"]),
            ("router, learnt admission", "route", 2, []),
            ("router, learnt admission, the replica with -t 2", "route", 1, ["--serve-threads", "2"])]
    summaries = []
    if a.only and "admission" not in a.only:
        runs = []
    for name, kind, n, extra in runs:
        serve = None
        if extra[:1] == ["--serve-threads"]:  # the same cores in one replica
            serve = [x if i == 0 or SERVE[i - 1] != "-t" else extra[1] for i, x in enumerate(SERVE)]
            extra = []
        row, s = experiment(name, kind, n, extra, prompts, a, serve)
        summaries.append((name + ", %d replica(s)" % n, s))
    for pol in ("prefix-affinity", "round-robin") if not a.only or "affinity" in a.only else ():
        row, s = experiment("8 system prompts, " + pol, "route", 2, ["--policy", pol], shared, a)
        summaries.append(("8 system prompts, " + pol, s))
    for name, s in summaries:
        print("\n%s:\n%s" % (name, s.strip()))


if __name__ == "__main__":
    main()
