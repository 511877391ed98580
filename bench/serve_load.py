#!/usr/bin/env python3
"""Load generator for `lamina serve` (or any OpenAI-compatible server).

C concurrent clients each send R streaming /v1/completions requests one
after another (greedy unless --temperature, EOS ignored, fixed output length) and record, per
request, the time to the first token, the gaps between tokens and the total
time. Prints request and output-token throughput and TTFT / ITL / end-to-end
latency (mean, p50, p99). Standard library only.

    python3 bench/serve_load.py --url http://127.0.0.1:8080 --clients 8 --requests 4 \
        --prompt-words 48 --max-tokens 32
"""
import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse

WORDS = ("the a of and to in is was that it for on with as his he at by from they this had not are but be "
         "story river mountain light city morning garden letter window music engine bridge winter school").split()


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p * (len(v) - 1))))] if v else 0.0


def one_request(host, port, path_prefix, prompt, max_tokens, model, temperature=0.0):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection(host, port, timeout=3600)
    t0 = time.monotonic()
    conn.request("POST", path_prefix + "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError("HTTP %d: %s" % (resp.status, resp.read()[:200]))
    times, usage = [], None
    buf = b""
    while True:
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: "):
                continue
            data = ev[6:]
            if data == b"[DONE]":
                break
            obj = json.loads(data)
            if obj.get("usage"):
                usage = obj["usage"]
            for ch in obj.get("choices", []):
                if ch.get("text"):
                    times.append(time.monotonic())
    t1 = time.monotonic()
    conn.close()
    n_out = usage["completion_tokens"] if usage else len(times)
    n_in = usage["prompt_tokens"] if usage else 0
    return {"t0": t0, "t1": t1, "times": times, "n_out": n_out, "n_in": n_in}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4, help="per client")
    ap.add_argument("--prompt-words", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--model", default="")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    if not a.model:  # the server's one model
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=60)
        conn.request("GET", u.path.rstrip("/") + "/v1/models")
        a.model = json.loads(conn.getresponse().read())["data"][0]["id"]
        conn.close()
    rng = random.Random(a.seed)
    prompts = [[" ".join(rng.choice(WORDS) for _ in range(a.prompt_words)) for _ in range(a.requests)]
               for _ in range(a.clients)]
    results, errors, lock = [], [], threading.Lock()

    def client(i):
        for p in prompts[i]:
            try:
                r = one_request(u.hostname, u.port or 80, u.path.rstrip("/"), p, a.max_tokens, a.model, a.temperature)
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001 - report every failure
                with lock:
                    errors.append(str(e))

    t0 = time.monotonic()
    th = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.monotonic() - t0
    ttft = [r["times"][0] - r["t0"] for r in results if r["times"]]
    itl = [b - a_ for r in results for a_, b in zip(r["times"], r["times"][1:])]
    e2e = [r["t1"] - r["t0"] for r in results]
    out = sum(r["n_out"] for r in results)
    inp = sum(r["n_in"] for r in results)
    print("clients %d, requests %d (%d failed), prompt %.1f tokens, output %.1f tokens on average, %.1f s"
          % (a.clients, len(results) + len(errors), len(errors), inp / max(1, len(results)),
             out / max(1, len(results)), wall))
    print("throughput: %.3f req/s, %.2f output tok/s, %.2f total tok/s" % (len(results) / wall, out / wall,
                                                                           (out + inp) / wall))
    for name, v in (("TTFT", ttft), ("ITL", itl), ("E2E", e2e)):
        if v:
            print("%-5s mean %8.1f  p50 %8.1f  p99 %8.1f ms" % (name, statistics.mean(v) * 1e3, pct(v, 0.5) * 1e3,
                                                               pct(v, 0.99) * 1e3))
    for e in errors[:5]:
        print("error:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
