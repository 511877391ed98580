#!/usr/bin/env python3
"""Served long prompts: `lamina serve` against `llama-server -np C` on the same GGUF.

The workload of issue #38: C concurrent clients (default 16), each one streaming
/v1/completions request with a distinct prompt of exactly P tokens (default 2,000, BOS
included) and exactly G answer tokens (default 256: max_tokens G, "ignore_eos": true, which
both servers honour; greedy, temperature 0). All C requests are sent at once.

Both servers are started here on the same file with the same threads and the same context per
sequence (P + G + 44 unless --ctx), and left running; the rounds then run on one server at a
time, interleaved (lamina, llama-server, lamina, llama-server, ...), so a loaded machine weighs
on both alike. Each round has prompts of its own (a seed per round), sent to both servers: no
prompt reaches a server twice, so neither lamina's prefix cache nor llama-server's slot cache
can help. The prompts are random words cut to P tokens by llama-server's /tokenize and
/detokenize; every answer's usage must then report P prompt tokens and G completion tokens on
both servers (lamina's tokenizer checked against llama.cpp's), or the run fails.

Per server and round it records, from the streamed chunks: output tokens/s (all output tokens
over the wall time from the first request sent to the last answer's end), TTFT p50/p99 (request
sent to its first token's chunk) and inter-token latency p50/p99 (gaps between one request's
consecutive token chunks, over all requests); the load average at the round's start. It prints
one markdown table (per round, then medians and lamina/llama-server ratios) and writes every
figure and both command lines as JSON to --out after each round (so a run stopped by a signal
keeps its finished rounds; both servers are stopped either way). --out must be a new file: an
existing one is refused unless --force, and an input (the model, either binary, this script)
always. Standard library only. A benchmark, not a test.

    python3 bench/serve16.py --lamina build/lamina \\
        --llama-server /work/llama.cpp/build/bin/llama-server \\
        -m ~/.cache/lamina/gemma-3-270m-q4_k_m.gguf --rounds 2 --out /tmp/serve16.json
"""
import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time

from serve_common import (check_out_path, executable, free_port, http_json, pct, positive, readable, stream_one,
                          wait_health, write_json)

WORDS = ("the a of and to in is was that it for on with as his he at by from they this had not are but be "
         "story river mountain light city morning garden letter window music engine bridge winter school "
         "cat dog house tree road blue green small quiet bright").split()


def make_prompts(cpp_port, n, n_tokens, seed):
    """n distinct texts of exactly n_tokens tokens each (BOS included) by llama.cpp's tokenizer."""
    rng = random.Random(seed)
    out, heads = [], set()
    while len(out) < n:
        text = " ".join(rng.choice(WORDS) for _ in range(int(n_tokens * 1.3) + 16))
        ids = http_json(cpp_port, "POST", "/tokenize", {"content": text, "add_special": False})["tokens"]
        if len(ids) < n_tokens:
            raise RuntimeError("a %d-word text made only %d tokens" % (len(text.split()), len(ids)))
        # the text of the first n_tokens - 1 tokens; a cut inside a merge may re-tokenize to one
        # more or less: step the cut until BOS + the text is exactly n_tokens
        cut = n_tokens - 1
        for _ in range(8):
            t = http_json(cpp_port, "POST", "/detokenize", {"tokens": ids[:cut]})["content"]
            got = len(http_json(cpp_port, "POST", "/tokenize", {"content": t, "add_special": True})["tokens"])
            if got == n_tokens:
                break
            cut += n_tokens - got
        else:
            raise RuntimeError("no cut of the text makes %d tokens" % n_tokens)
        head = tuple(ids[:16])
        if head in heads:  # distinct from the start: no shared prefix block
            continue
        heads.add(head)
        out.append(t)
    return out


def run_round(port, prompts, max_tokens, model):
    res, errors, lock = [None] * len(prompts), [], threading.Lock()
    start = threading.Barrier(len(prompts) + 1)

    def client(i):
        start.wait()
        try:
            res[i] = stream_one(port, prompts[i], max_tokens, model)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            with lock:
                errors.append("client %d: %s" % (i, e))

    th = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(prompts))]
    for t in th:
        t.start()
    start.wait()
    for t in th:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors[:4]))
    t_first = min(r["t0"] for r in res)
    wall = max(r["t1"] for r in res) - t_first
    out = sum(r["completion_tokens"] for r in res)
    ttft = [r["times"][0] - r["t0"] for r in res if r["times"]]
    itl = [b - a for r in res for a, b in zip(r["times"], r["times"][1:])]
    return {
        "wall_s": wall, "output_tokens": out, "output_tok_s": out / wall,
        "ttft_p50_ms": pct(ttft, 0.5) * 1e3, "ttft_p99_ms": pct(ttft, 0.99) * 1e3,
        "itl_p50_ms": pct(itl, 0.5) * 1e3, "itl_p99_ms": pct(itl, 0.99) * 1e3,
        "itl_max_ms": max(itl) * 1e3 if itl else float("nan"), "itl_gaps": len(itl),
        "prompt_tokens": [r["prompt_tokens"] for r in res],
        "completion_tokens": [r["completion_tokens"] for r in res],
        "token_chunks": [len(r["times"]) for r in res],
        "finish_reasons": [r["finish_reason"] for r in res],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("-m", "--model", required=True, type=readable, help="the GGUF both servers load")
    ap.add_argument("--out", required=True, help="the JSON file to write (a new path)")
    ap.add_argument("--force", action="store_true", help="replace an existing --out (never an input)")
    ap.add_argument("--lamina", default="build/lamina", type=executable)
    ap.add_argument("--llama-server", default="/work/llama.cpp/build/bin/llama-server", type=executable)
    ap.add_argument("--rounds", type=positive(1), default=2, help="rounds per server (default 2)")
    ap.add_argument("--clients", type=positive(1), default=16, help="concurrent requests (default 16)")
    ap.add_argument("--prompt-tokens", type=positive(8), default=2000, help="per prompt, BOS included")
    ap.add_argument("--max-tokens", type=positive(2), default=256, help="answer tokens per request")
    ap.add_argument("--ctx", type=positive(1), default=0, help="positions per sequence (default P + G + 44)")
    ap.add_argument("-t", "--threads", type=positive(1), default=2)
    ap.add_argument("--seed", type=int, default=1, help="prompt seed (round r uses seed + r)")
    ap.add_argument("--lamina-args", default="", help="more `lamina serve` options, space-separated")
    ap.add_argument("--llama-args", default="", help="more llama-server options, space-separated")
    ap.add_argument("--only", choices=("lamina", "llama-server"), help="run one server only")
    a = ap.parse_args()
    ctx = a.ctx or a.prompt_tokens + a.max_tokens + 44
    if ctx < a.prompt_tokens + a.max_tokens:
        ap.error("--ctx %d is below --prompt-tokens + --max-tokens (%d)" % (ctx, a.prompt_tokens + a.max_tokens))
    here = os.path.abspath(__file__)
    check_out_path(a.out, [("model", a.model), ("lamina binary", a.lamina), ("llama-server binary", a.llama_server),
                           ("benchmark script", here)], a.force, "serve16")

    lp, cp = free_port(), free_port()
    lam_cmd = [a.lamina, "serve", "-m", a.model, "-t", str(a.threads), "-c", str(ctx), "--max-seqs",
               str(a.clients), "--port", str(lp), *a.lamina_args.split()]
    cpp_cmd = [a.llama_server, "-m", a.model, "-np", str(a.clients), "-c", str(a.clients * ctx), "-fa", "on",
               "-t", str(a.threads), "--port", str(cp), *a.llama_args.split()]
    print("lamina:       " + " ".join(lam_cmd))
    print("llama-server: " + " ".join(cpp_cmd))
    sys.stdout.flush()
    engines = [e for e in ("lamina", "llama-server") if not a.only or e == a.only]
    procs, rows = [], []

    def on_term(signum, frame):  # `timeout` or kill: stop both servers and keep the rounds done
        raise SystemExit("serve16: stopped by signal %d" % signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)

    def save():  # after each round, so a run cut short keeps what it measured
        write_json(a.out, {"argv": sys.argv, "lamina_cmd": lam_cmd, "llama_server_cmd": cpp_cmd,
                           "clients": a.clients, "prompt_tokens": a.prompt_tokens, "max_tokens": a.max_tokens,
                           "ctx": ctx, "rounds": rows}, "serve16")
    try:
        lproc = subprocess.Popen(lam_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(lproc)
        cproc = subprocess.Popen(cpp_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(cproc)
        wait_health(cp, cproc, "llama-server")  # its tokenizer cuts the prompts, even for --only lamina
        if "lamina" in engines:
            wait_health(lp, lproc, "lamina serve")
        models = {"lamina": http_json(lp, "GET", "/v1/models")["data"][0]["id"] if "lamina" in engines else "",
                  "llama-server": http_json(cp, "GET", "/v1/models")["data"][0]["id"]}
        ports = {"lamina": lp, "llama-server": cp}
        warm = make_prompts(cp, 1, 64, a.seed - 1)[0]
        for e in engines:  # pages in the weights; not timed
            stream_one(ports[e], warm, 8, models[e])
        for r in range(a.rounds):
            prompts = make_prompts(cp, a.clients, a.prompt_tokens, a.seed + r)
            for e in engines:
                load = os.getloadavg()
                row = run_round(ports[e], prompts, a.max_tokens, models[e])
                row.update({"engine": e, "round": r + 1, "loadavg": list(load), "time": time.strftime(
                    "%H:%M:%S", time.gmtime())})
                bad = [x for x in row["prompt_tokens"] if x != a.prompt_tokens] + \
                      [x for x in row["completion_tokens"] if x != a.max_tokens]
                rows.append(row)
                save()
                print("round %d %-12s %8.2f output tok/s  TTFT p50 %7.0f p99 %7.0f ms  ITL p50 %6.1f p99 %6.1f ms"
                      "  wall %6.1f s  (load %.2f)" % (r + 1, e, row["output_tok_s"], row["ttft_p50_ms"],
                                                       row["ttft_p99_ms"], row["itl_p50_ms"], row["itl_p99_ms"],
                                                       row["wall_s"], load[0]))
                sys.stdout.flush()
                if bad:
                    raise RuntimeError("%s: usage reported prompt tokens %s and completion tokens %s, not %d and %d"
                                       % (e, sorted(set(row["prompt_tokens"])), sorted(set(row["completion_tokens"])),
                                          a.prompt_tokens, a.max_tokens))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        if rows:
            print("wrote %s" % a.out)

    keys = ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")
    print()
    print("%d clients, %d-token prompts, %d answer tokens, -t %d, context %d per sequence"
          % (a.clients, a.prompt_tokens, a.max_tokens, a.threads, ctx))
    print()
    print("| server | round | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | wall s | load |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print("| %s | %d | %.2f | %.0f | %.0f | %.1f | %.1f | %.1f | %.2f |"
              % (row["engine"], row["round"], *(row[k] for k in keys), row["wall_s"], row["loadavg"][0]))
    med = {e: {k: statistics.median(x[k] for x in rows if x["engine"] == e) for k in keys + ("wall_s",)}
           for e in engines}
    for e in engines:
        m = med[e]
        print("| %s | median | %.2f | %.0f | %.0f | %.1f | %.1f | %.1f | |"
              % (e, *(m[k] for k in keys), m["wall_s"]))
    if len(engines) == 2:
        l, c = med["lamina"], med["llama-server"]
        print("| lamina / llama-server | | %.2fx | %.2fx | %.2fx | %.2fx | %.2fx | %.2fx | |"
              % (*(l[k] / c[k] for k in keys), l["wall_s"] / c["wall_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
