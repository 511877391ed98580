#!/usr/bin/env python3
"""fair_ttft.py - does a small request from one client get its first token within 2 s while
another client's 1,000-sequence job runs in `lamina serve`?

Not part of `make test` (tests/e2e_fair.py checks the order of service in seconds). Starts
`lamina serve` on the bundled model with its default limits (--max-seqs 64, --max-waiting 256),
then:

  1. idle: --probes small streamed completions (4 tokens) from 127.0.0.9, one after another:
     their time to first token (TTFT);
  2. the job: client A (127.0.0.2) sends --job-requests requests at once, each of --prompts
     prompts x n --n (64 sequences a request by default, the most --max-seqs lets one request
     ask for; 16 x 64 = 1,024 sequences in all), --job-tokens tokens each, ignore_eos;
  3. while the job runs, client B (127.0.0.9) sends a small streamed completion every
     --every seconds: each one's TTFT, until A's job ends.

With --same-client, A and B send the same API key, so they are one client to the server and B
waits behind the job (the contrast: fairness is between clients, not requests). Prints the
idle TTFTs, B's TTFTs during the job (median, largest, how many within --bound), the job's
length and the server's preemptions. Exit status 0 when every probe during the job was
answered within the bound (and, with --same-client, always 0: it shows the contrast).

    python3 bench/fair_ttft.py
    python3 bench/fair_ttft.py --same-client
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests"))
import testenv  # noqa: E402

KEY = "fair-ttft-key"


def headers(key):
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    return h


def probe(port, key, timeout):
    """One small streamed completion from 127.0.0.9: seconds to its first token, or None."""
    body = {"prompt": "The cat", "max_tokens": 4, "ignore_eos": True, "temperature": 0, "stream": True}
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=("127.0.0.9", 0))
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body), headers=headers(key))
        r = c.getresponse()
        if r.status != 200:
            r.read()
            return None
        first = None
        for line in r:
            if line.startswith(b"data: {") and first is None:
                first = time.time() - t0
            if line.startswith(b": lamina queue_time=") and os.environ.get("FAIR_DEBUG"):
                print("  queue_time %s, first token %.3f s" % (line.decode().strip(), first or -1))
            if line.startswith(b"data: [DONE]"):
                break
        return first
    except OSError:
        return None
    finally:
        c.close()


def job_request(port, key, args, out):
    body = {"prompt": ["Once upon a time %d" % i for i in range(args.prompts)], "n": args.n,
            "max_tokens": args.job_tokens, "ignore_eos": True, "temperature": 0.8, "seed": 7}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1200, source_address=("127.0.0.2", 0))
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body), headers=headers(key))
        r = c.getresponse()
        data = r.read()
        out.append(r.status if r.status == 200 else (r.status, data[:200]))
    except OSError as e:
        out.append(str(e))
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lamina", default=os.path.join(ROOT, "build", "lamina"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "stories260K.gguf"))
    ap.add_argument("--job-requests", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--job-tokens", type=int, default=256)
    ap.add_argument("--probes", type=int, default=10)
    ap.add_argument("--every", type=float, default=0.5)
    ap.add_argument("--bound", type=float, default=2.0)
    ap.add_argument("--same-client", action="store_true")
    args = ap.parse_args()

    argv = [args.lamina, "serve", "-m", args.model, "-c", "512", "--ctx-extend"]
    key = None
    if args.same_client:
        key = KEY
        argv += ["--api-key", key]
    srv = testenv.Server(argv)
    try:
        idle = [probe(srv.port, key, 30) for _ in range(args.probes)]
        print("idle TTFT: median %.3f s, largest %.3f s (%d probes)" %
              (statistics.median(idle), max(idle), len(idle)))
        m0 = srv.metrics()
        done = []
        t0 = time.time()
        ts = [threading.Thread(target=job_request, args=(srv.port, key, args, done)) for _ in range(args.job_requests)]
        for t in ts:
            t.start()
        deadline = time.time() + 60  # every request of the job is in the engine
        while time.time() < deadline and srv.metrics().get("lamina_requests_total", 0) < \
                m0.get("lamina_requests_total", 0) + args.job_requests:
            time.sleep(0.01)
        during, starts = [], []
        while any(t.is_alive() for t in ts):
            t1 = time.time()
            during.append(probe(srv.port, key, 600))
            starts.append(t1 - t0)
            time.sleep(max(0.0, args.every - (time.time() - t1)))
        for t in ts:
            t.join()
        job_s = time.time() - t0
        m1 = srv.metrics()
        seqs = args.job_requests * args.prompts * args.n
        ok = [d for d in during if d is not None]
        within = sum(1 for d in ok if d <= args.bound)
        print("job: %d requests x %d sequences = %d sequences of %d tokens, %.1f s, answers %s" %
              (args.job_requests, args.prompts * args.n, seqs, args.job_tokens, job_s,
               sorted(set(map(str, done)))))
        if ok:
            print("TTFT during the job: %d probes, median %.3f s, largest %.3f s, %d of %d within %.1f s" %
                  (len(during), statistics.median(ok), max(ok), within, len(during), args.bound))
        print("probes (start s: TTFT s): " + ", ".join("%.1f: %s" % (a, "%.3f" % d if d is not None else "none")
                                                       for a, d in zip(starts, during)))
        print("preemptions %d, generated tokens %d" %
              (m1.get("lamina_preemptions_total", 0) - m0.get("lamina_preemptions_total", 0),
               m1.get("lamina_generation_tokens_total", 0) - m0.get("lamina_generation_tokens_total", 0)))
        good = len(during) > 0 and within == len(during)
        print("verdict: %s (%s)" % ("PASS" if good else "FAIL",
                                    "one client: the contrast" if args.same_client else "two clients"))
        return 0 if good or args.same_client else 1
    finally:
        srv.stop("server")


if __name__ == "__main__":
    sys.exit(main())
