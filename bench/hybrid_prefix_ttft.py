#!/usr/bin/env python3
"""hybrid_prefix_ttft.py - time to first token of requests that share a long system prompt on a
hybrid model (recurrent state beside attention), with the prefix cache's state snapshots and
without them.

Not part of `make test` (tests/e2e_engine_hybrid.py and tests/test_engine_hybrid.c check the
outputs). Writes `lamina mkmodel --preset qwen35-small` (F16, the GPT-2 vocabulary) and serves
it twice, one server at a time:

  - `--state-snapshots 0`: no snapshot slot, so every KV prefix hit is cut to nothing and every
    prompt is prefilled from position 0 (what the prefix cache off gives a hybrid model);
  - the default snapshots.

On each, --requests streamed greedy completions (4 tokens) go one after another: a system
prompt of --system token ids, then --user ids of each request's own. Request 1 finds nothing;
request 2 finds the system prompt's KV blocks and the state at the last snapshot point below it
that request 1 saved (a chunk end); from request 3 on, the state where the shared prompt ends
(request 2 saved it there). Last, request 1's prompt again (all but its last positions cached).
Prints each request's TTFT (median of --reps runs of the whole sequence, a fresh server each) and
its usage's cached tokens, and the ratio of the two servers' TTFTs.

    python3 bench/hybrid_prefix_ttft.py                 # a 2,000-token system prompt
    python3 bench/hybrid_prefix_ttft.py --system 1000 --user 200
"""
import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests"))
import testenv  # noqa: E402

VOCAB = os.path.join(ROOT, "tests", "data", "vocab", "ggml-vocab-gpt-2.gguf")


def ttft(port, prompt):
    """Seconds to the first streamed token of a greedy completion of token ids; cached tokens."""
    body = {"prompt": prompt, "max_tokens": 4, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.time()
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first, cached = None, -1
    for line in r:
        if line.startswith(b"data: {"):
            d = json.loads(line[6:])
            if first is None and d.get("choices"):
                first = time.time() - t0
            u = d.get("usage") or {}
            cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", cached)
        if line.startswith(b"data: [DONE]"):
            break
    c.close()
    return first, cached


def run(args, model, extra, prompts):
    """Each prompt's TTFT (median over reps) and cached tokens, on servers with extra flags."""
    times = [[] for _ in prompts]
    cached = [None] * len(prompts)
    for _ in range(args.reps):
        srv = testenv.Server([args.lamina, "serve", "-m", model, "-t", str(args.threads), "-c", str(args.ctx),
                              "--max-seqs", "4"] + extra)
        try:
            for i, p in enumerate(prompts):
                t, cached[i] = ttft(srv.port, p)
                times[i].append(t)
        finally:
            srv.stop("server")
    return [statistics.median(t) for t in times], cached


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lamina", default=os.path.join(ROOT, "build", "lamina"))
    ap.add_argument("--system", type=int, default=2000, help="shared system prompt tokens")
    ap.add_argument("--user", type=int, default=100, help="each request's own tokens")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    args = ap.parse_args()
    rng = random.Random(1)
    system = [rng.randrange(100, 40000) for _ in range(args.system)]
    prompts = [system + [rng.randrange(100, 40000) for _ in range(args.user)] for _ in range(args.requests)]
    prompts.append(prompts[0])
    with tempfile.TemporaryDirectory(prefix="lamina_hybrid_ttft_") as tmp:
        model = os.path.join(tmp, "qwen35.gguf")
        subprocess.run([args.lamina, "mkmodel", "--preset", "qwen35-small", "--type", "F16", "--vocab-from", VOCAB,
                        "-o", model], check=True, capture_output=True)
        off, c_off = run(args, model, ["--state-snapshots", "0"], prompts)
        on, c_on = run(args, model, [], prompts)
    print("qwen35-small F16, %d threads, system prompt %d tokens + %d of each request's own, 4 tokens each, "
          "median of %d" % (args.threads, args.system, args.user, args.reps))
    print("| request | TTFT, no snapshots | cached | TTFT, snapshots | cached | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for i in range(len(prompts)):
        name = "%d" % (i + 1) if i < args.requests else "1 again"
        print("| %s | %.3f s | %d | %.3f s | %d | %.2fx |" % (name, off[i], c_off[i], on[i], c_on[i], off[i] / on[i]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
