#!/usr/bin/env python3
"""Clients take turns in `lamina serve` (docs/engine.md, "The scheduler").

One server that runs two sequences at a time (--max-seqs 2). Client A (address 127.0.0.2)
queues 24 long completions at once; client B (127.0.0.3) then sends one short completion.
B's request waits behind A's running ones only: of A's requests still unfinished when B's
came, at most 3 finish before it, where arrival order alone would put it after all of them.
The same two clients as one API key's (a server with --api-key): one client, so B's request
waits behind all of A's earlier ones (all but two at most: the one running beside it, and one
whose answer a loaded client thread reads after B's; times are taken where the client reads).
On the bundled model (models/stories260K.gguf).
"""
import http.client
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testenv  # noqa: E402
from testenv import result  # noqa: E402

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
MODEL = "models/stories260K.gguf"
N_A = 24


def complete(port, src, body, out, key=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600, source_address=(src, 0))
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body), headers=headers)
        r = c.getresponse()
        r.read()
        out.append((src, r.status, time.time()))
    except OSError as e:
        out.append((src, str(e), time.time()))
    finally:
        c.close()


def run(key):
    args = [LAMINA, "serve", "-m", MODEL, "--max-seqs", "2", "-t", "1", "--max-waiting", "0", "-c", "1024", "--ctx-extend"]
    if key:
        args += ["--api-key", key]
    srv = testenv.Server(args)
    done = []
    try:
        long_body = {"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True, "temperature": 0}
        ts = [threading.Thread(target=complete, args=(srv.port, "127.0.0.2", long_body, done, key)) for _ in range(N_A)]
        for t in ts:
            t.start()
        deadline = time.time() + 60  # every one of A's requests is in the engine
        while time.time() < deadline:
            m = srv.metrics()
            if m.get("lamina_requests_total", 0) >= N_A:
                break
            time.sleep(0.01)
        t_b = time.time()
        b = threading.Thread(target=complete, args=(srv.port, "127.0.0.3", dict(long_body, max_tokens=4), done, key))
        b.start()
        b.join(600)
        for t in ts:
            t.join(600)
    finally:
        testenv.terminate(srv, "fair")
    # A's requests that finished after B was sent and before B's answer
    ok = all(status == 200 for _, status, _ in done) and len(done) == N_A + 1
    t_b_done = [t for src, _, t in done if src == "127.0.0.3"]
    a_before = -1
    if t_b_done:
        a_before = sum(1 for src, _, t in done if src == "127.0.0.2" and t_b <= t < t_b_done[0])
    a_left = sum(1 for src, _, t in done if src == "127.0.0.2" and t >= t_b)
    return ok, a_before, a_left, done


def main():
    ok, a_before, a_left, done = run(None)
    result("clients by address: every request answered", ok, done[:4])
    result("clients by address: B answered after at most 3 of A's still unfinished when it came",
           0 <= a_before <= 3 and a_left >= 10, "%d of A's %d before B" % (a_before, a_left))
    ok, a_before, a_left, done = run("k1")
    result("one API key: every request answered", ok, done[:4])
    result("one API key is one client: B waits behind all of A's earlier ones", a_before >= a_left - 2 and
           a_left >= 10, "%d of A's %d before B" % (a_before, a_left))
    return testenv.summary()


if __name__ == "__main__":
    sys.exit(main())
