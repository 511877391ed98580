#!/usr/bin/env python3
"""End-to-end checks of `lamina route` over spawned replicas of the bundled model.

Each router is started as `$LAMINA_BIN route --spawn N -m models/stories260K.gguf
--port 0 ... -- <serve options>`; the script reads the router's port and each
replica's pid and port from its stderr, waits until /health reports every
replica healthy, and always stops it with SIGTERM at the end: it must exit 0,
take its replicas with it and print nothing from the sanitizers.

  1. The official `openai` client through the router (the same checks as
     e2e_server.py makes against one server: completions, chat, streaming,
     n=2, stop strings, usage, logprobs, streamed text equal to the
     non-streamed text for the same seed), and /v1/models, /health, /metrics.
  2. Faults: 128 streaming requests from 64 clients while one replica is
     killed with SIGKILL: every request ends (a complete stream, or an error
     status or error event; none hangs past the client's timeout), most
     complete, the replica is restarted (a new pid) and re-admitted (healthy
     in the router's /metrics, and it takes requests again).
  3. Client disconnect: a long stream closed after a few chunks; the
     replica that ran it stops (far fewer tokens generated than asked), runs
     nothing and holds no KV block.
  4. Admission: one replica, one request in flight, a queue of 2: a burst
     gets 429 with Retry-After for what does not fit, and the rest complete;
     the router's /metrics counts the rejections and never shows the
     replica more than 1 in flight. The trace's engine_admit (the replica
     engine's queue time after the send) lies between send and first; with
     an engine of one slot and six requests let through, the wait shows
     inside the engine and `lamina trace` says so; a replica that does not
     report its queue time gets null.
  5. Prefix affinity: requests sharing a long prefix all go to one replica
     (the router's per-replica counters), whose prefix cache then hits;
     round-robin spreads the same requests.
  6. API keys: --api-key at the router (401 without it), --upstream-key to
     the replicas (which then refuse a request without it).
  7. Learnt admission: one replica with 8 sequence slots under 64 clients:
     the router's limit for it grows past 1 to what the engine runs, the
     engine runs full batches, and the router, not the replica, holds the
     rest (the trace's samples).
  8. Bad replicas (a stand-in HTTP server given with --replica): a stream
     cut before [DONE] ends with an error event and [DONE]; a whole answer
     cut short is a 502 after the retries; a replica that never answers is
     given up on after --timeout and ejected; a request that has not started
     on it is retried on a good replica.
  9. First-byte deadline (--first-byte-timeout 1): beside a real replica, a
     stand-in that takes streamed requests and sends nothing: every stream
     is answered whole by the real one within seconds, the stand-in's
     timeouts are counted in /metrics and halve its limit; alone, it gets
     the client a 504 naming it; a whole answer slower than the deadline is
     not cut (whole answers have no first-byte deadline).
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_server as es  # noqa: E402 (shared helpers and the openai client checks)
import testenv  # noqa: E402
from testenv import result, summary  # noqa: E402

LAMINA = es.LAMINA
MODEL = es.MODEL
ASAN = es.ASAN
CTX = 1024
SERVE = ["-t", "1", "--chat-template", "chatml", "-c", str(CTX), "--ctx-extend"]

lock = threading.Lock()  # for what the checks' threads share


class Router:
    def __init__(self, n, *args, serve=SERVE):
        self.n = n
        self.args = [LAMINA, "route", "--spawn", str(n), "-m", MODEL, "--port", "0", *args, "--", *serve]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines = []
        self.port = None
        self.pids = {}       # replica index -> latest pid
        self.rports = {}     # replica index -> port
        got = threading.Event()

        def reader():
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                with lock:
                    self.lines.append(line)
                m = re.search(r"lamina route: replica (\d+) pid (\d+) at http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.pids[int(m.group(1))] = int(m.group(2))
                    self.rports[int(m.group(1))] = int(m.group(3))
                m = re.search(r"lamina route: listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    got.set()
            got.set()

        self.reader = threading.Thread(target=reader, daemon=True)
        self.reader.start()
        got.wait(60)
        if self.port is None:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("router did not start: %s" % "\n".join(self.lines))
        if not self.wait_healthy(n + args.count("--replica"), 120):
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("replicas never became healthy: %s" % "\n".join(self.lines))

    def wait_healthy(self, n, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                st, _, body = es.get(self, "/health")
                if st == 200 and json.loads(body).get("replicas_healthy") == n:
                    return True
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        return False

    def replica(self, i):
        """A stand-in for e2e_server's Server, aimed at replica i directly."""
        return type("R", (), {"port": self.rports[i]})()

    def stop(self, name):
        ended = testenv.terminate(self, name)
        if not ended:
            return
        rc, text, bad = ended
        alive = [p for p in self.pids.values() if os.path.exists("/proc/%d" % p) and
                 not open("/proc/%d/stat" % p).read().split()[2] == "Z"]
        result("%s: clean exit, replicas stopped" % name, rc == 0 and not bad and not alive,
               "exit %s, alive %s\n%s" % (rc, alive, text[-3000:]))


def rmetrics(rt):
    return es.metrics(rt)


def per_replica(m, name):
    """{url: value} of a per-replica router metric."""
    out = {}
    for k, v in m.items():
        mm = re.match(r'%s\{replica="([^"]+)"\}$' % name, k)
        if mm:
            out[mm.group(1)] = v
    return out


def stream(rt, body, timeout=120, path="/v1/completions"):
    """POST a streaming request; (status, data payloads)."""
    c = http.client.HTTPConnection("127.0.0.1", rt.port, timeout=timeout)
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        payload = r.read().decode()
        return r.status, dict(r.getheaders()), [ln[6:] for ln in payload.split("\n") if ln.startswith("data: ")]
    finally:
        c.close()


# --------------------------------------------------------------- 1. basics

def check_basics(rt):
    st, _, body = es.get(rt, "/health")
    result("health: every replica healthy", st == 200 and json.loads(body)["replicas_healthy"] == rt.n, body)
    st, _, body = es.get(rt, "/v1/models")
    result("models forwarded", st == 200 and json.loads(body)["data"][0]["id"] == es.MODEL_NAME, body)
    st, _, body = es.post(rt, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
    direct = es.post(rt.replica(0), "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8,
                                                        "temperature": 0})[2]
    result("completion through the router equals the replica's", st == 200 and
           json.loads(body)["choices"][0]["text"] == json.loads(direct)["choices"][0]["text"], (body, direct))
    st, hdrs, events = stream(rt, {"prompt": "Once upon a time", "max_tokens": 12, "stream": True})
    result("stream passed through", st == 200 and hdrs.get("Content-Type") == "text/event-stream" and
           len(events) >= 3 and events[-1] == "[DONE]", (st, hdrs, events[-3:]))
    st, _, body = es.post(rt, "/v1/completions", {"prompt": "x", "max_tokens": -3})
    result("the replica's 400 passed through", st == 400 and "error" in json.loads(body), body)
    st, _, body = es.post(rt, "/v1/nothing", {})
    result("unknown route 404", st == 404, body)
    st, _, body = es.request(rt, "GET", "/v1/completions")
    result("wrong method 405", st == 405, body)
    m = rmetrics(rt)
    result("metrics: router counters", m.get("lamina_router_requests_admitted_total", 0) >= 3 and
           "lamina_router_queue_depth" in m and 'lamina_router_queue_seconds_bucket{le="+Inf"}' in m, m)


def check_client(rt):
    es.check_client(rt)  # counted in the same totals (testenv)


# --------------------------------------------------------------- 2. faults

def check_kill(rt):
    clients, total = (16, 32) if ASAN else (64, 128)
    todo = list(range(total))
    outcome = {}
    victim = 1
    old_pid = rt.pids[victim]
    m0 = rmetrics(rt)

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            body = {"prompt": "Once upon a time" if i % 2 else "The little dog", "max_tokens": 64 + i % 64,
                    "stream": i % 2 == 0, "temperature": 0.8, "seed": i, "ignore_eos": True}
            try:
                if not body["stream"]:  # nothing reaches the client before the end: retried, never lost
                    st, _, raw = es.post(rt, "/v1/completions", body, timeout=120)
                    ok = st == 200 and json.loads(raw)["usage"]["completion_tokens"] == body["max_tokens"]
                    with lock:
                        outcome[i] = "complete" if ok else "whole-failed %s" % st
                    continue
                st, _, events = stream(rt, body, timeout=120)
                if st == 200 and events and events[-1] == "[DONE]":
                    err = any(e.startswith('{"error"') for e in events)
                    kind = "error-event" if err else "complete"
                elif st != 200:
                    kind = "error-status"
                else:
                    kind = "truncated"
            except (OSError, ValueError, http.client.HTTPException) as e:
                kind = "exception %s" % e
            with lock:
                outcome[i] = kind

    ts = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.time()
    for t in ts:
        t.start()
    # kill one replica once it is busy
    deadline = time.time() + 30
    busy = False  # the victim held requests when it was killed
    while time.time() < deadline:
        inflight = per_replica(rmetrics(rt), "lamina_router_replica_in_flight")
        if inflight.get("http://127.0.0.1:%d" % rt.rports[victim], 0) >= 8 and len(outcome) < total:
            busy = True
            break
        time.sleep(0.02)
    os.kill(old_pid, signal.SIGKILL)
    for t in ts:
        t.join(300)
    hung = [t for t in ts if t.is_alive()]
    kinds = {}
    for k in outcome.values():
        kinds[k] = kinds.get(k, 0) + 1
    print("NOTE kill: %d requests in %.1f s: %s" % (total, time.time() - t0, kinds))
    bad = {k: v for k, v in kinds.items() if k not in ("complete", "error-event", "error-status")}
    result("kill -9: every request ended (complete or an error), none hung; every whole answer complete",
           not hung and len(outcome) == total and not bad, (len(hung), kinds))
    result("kill -9: most requests complete", kinds.get("complete", 0) >= total // 2, kinds)
    # restarted and re-admitted
    deadline = time.time() + 60
    while time.time() < deadline and rt.pids.get(victim) == old_pid:
        time.sleep(0.05)
    result("kill -9: the replica was restarted", rt.pids.get(victim) != old_pid, rt.lines[-10:])
    result("kill -9: the replica was re-admitted", rt.wait_healthy(rt.n, 60), rt.lines[-10:])
    m1 = rmetrics(rt)
    ej = per_replica(m1, "lamina_router_replica_ejections_total")
    result("kill -9: the router ejected it", sum(ej.values()) >= 1, ej)
    url = "http://127.0.0.1:%d" % rt.rports[victim]
    sent0 = per_replica(m1, "lamina_router_replica_sent_total").get(url, 0)
    for i in range(6):
        es.post(rt, "/v1/completions", {"prompt": "Round %d" % i, "max_tokens": 4}, timeout=60)
    sent1 = per_replica(rmetrics(rt), "lamina_router_replica_sent_total").get(url, 0)
    result("kill -9: the re-admitted replica takes requests again", sent1 > sent0, (sent0, sent1))
    for i in range(rt.n):
        ok, m = es.wait_idle(rt.replica(i))
        result("kill -9: replica %d idle afterwards, no KV block held" % i, ok, m)
    result("kill -9: router queue empty", rmetrics(rt).get("lamina_router_queue_depth") == 0)
    retried = rmetrics(rt).get("lamina_router_requests_retried_total", 0) - m0.get(
        "lamina_router_requests_retried_total", 0)
    if busy:
        result("kill -9: requests that had not started were retried elsewhere", retried >= 1, retried)
    else:  # a slow build (sanitizers) may never fill the victim within the deadline: nothing to retry
        print("NOTE kill -9: the victim never held 8 requests within 30 s; the retry check needs a busy victim")


# ------------------------------------------------------------- 3. disconnect

def check_disconnect(rt):
    reps = [rt.replica(i) for i in range(rt.n)]
    before = sum(es.metrics(r).get("lamina_generation_tokens_total", 0) for r in reps)
    want = CTX - 24
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": want, "ignore_eos": True, "stream": True,
                       "temperature": 0.9}).encode()
    s = socket.create_connection(("127.0.0.1", rt.port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    got = b""
    while got.count(b"data: ") < 4:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    s.close()
    result("disconnect: stream started", got.startswith(b"HTTP/1.1 200") and b"data: {" in got, got[:300])
    oks = [es.wait_idle(r) for r in reps]
    result("disconnect: replicas run nothing, every KV block back", all(o for o, _ in oks), [m for _, m in oks])
    after = sum(es.metrics(r).get("lamina_generation_tokens_total", 0) for r in reps)
    result("disconnect: the replica's request was cancelled early", after - before < want,
           "%d of %d tokens generated" % (after - before, want))
    deadline = time.time() + 10
    while time.time() < deadline and rmetrics(rt).get("lamina_router_requests_cancelled_total", 0) < 1:
        time.sleep(0.05)
    result("disconnect: the router counts it cancelled",
           rmetrics(rt).get("lamina_router_requests_cancelled_total", 0) >= 1)


# --------------------------------------------------------------- 4. admission

def check_queue_bound():
    rt = Router(1, "--max-queue", "2", "--max-inflight-per-replica", "1", "--trace", TRACE)
    try:
        statuses = []
        retry_after = []
        peak = [0]
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                v = per_replica(rmetrics(rt), "lamina_router_replica_in_flight")
                peak[0] = max(peak[0], max(v.values()))
                time.sleep(0.01)

        def one(i):
            st, hdrs, _ = es.request(rt, "POST", "/v1/completions",
                                     {"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True,
                                      "seed": i}, timeout=120)
            with lock:
                statuses.append(st)
                if st == 429:
                    retry_after.append(hdrs.get("Retry-After"))

        w = threading.Thread(target=watch)
        w.start()
        ts = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        stop.set()
        w.join()
        n429 = statuses.count(429)
        result("queue bound: 429 for what does not fit", n429 >= 1 and statuses.count(200) >= 3 and
               n429 + statuses.count(200) == 16, statuses)
        result("queue bound: 429 carries Retry-After", retry_after and all(r == "1" for r in retry_after),
               retry_after)
        m = rmetrics(rt)
        result("queue bound: rejections counted", m.get("lamina_router_requests_rejected_total") == n429, m)
        result("fixed limit: never more than 1 in flight at the replica", peak[0] == 1, peak[0])
    finally:
        rt.stop("router (queue bound)")
    # the trace: a start line, samples, one line per request that was queued
    try:
        lines = [json.loads(l) for l in open(TRACE)]
        reqs = [l for l in lines if l["kind"] == "req"]
        samples = [l for l in lines if l["kind"] == "sample"]
        ok = lines[0]["kind"] == "start" and samples and len(reqs) == statuses.count(200) and all(
            0 <= r["arrive"] <= r["admit"] <= r["send"] <= r["first"] <= r["done"] for r in reqs)
        result("trace: per-request hops in order, samples", ok, lines[:3])
        bad = [r for r in reqs if r["engine_admit"] is None or not r["send"] < r["engine_admit"] <= r["first"]]
        result("trace: every request admitted by the replica's engine between send and first", reqs and not bad,
               bad[:3])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        result("trace: per-request hops in order, samples", False, e)


def check_engine_admit():
    """Requests the router lets through to an engine with one running slot wait inside that engine: each
    one's engine_admit lies between its send and its first byte (streams too: their first byte is the first
    token's chunk) or, for a stream, its end; `lamina trace` says the wait was inside the engines."""
    trace = TRACE + ".admit"
    rt = Router(1, "--trace", trace, "--max-inflight-per-replica", "6", serve=SERVE + ["--max-seqs", "1"])
    codes = []
    try:
        def one(i):
            body = {"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True, "seed": i,
                    "stream": i % 2 == 1}
            st = stream(rt, body)[0] if body["stream"] else es.post(rt, "/v1/completions", body, timeout=120)[0]
            with lock:
                codes.append(st)

        ts = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        result("engine admit: every request answered", codes == [200] * 6, codes)
    finally:
        rt.stop("router (engine admit)")
    try:
        reqs = [r for r in map(json.loads, open(trace)) if r["kind"] == "req"]
        ok = len(reqs) == 6 and all(r["engine_admit"] is not None and r["send"] < r["engine_admit"] <= r["done"] and
                                    (r["stream"] or r["engine_admit"] <= r["first"]) for r in reqs)
        result("engine admit: each request's engine_admit between its send and its first byte (its end for a "
               "stream)", ok, reqs)
        late = sum(r["stream"] and r["engine_admit"] > r["first"] for r in reqs)
        if late:
            print("NOTE engine admit: %d streams had a first byte (a keep-alive) before their engine admission"
                  % late)
        waits = sorted(r["engine_admit"] - r["send"] for r in reqs)
        held = max(r["admit"] - r["arrive"] for r in reqs)
        result("engine admit: one slot, so later requests waited in the engine longer than at the router",
               waits[-1] > held and waits[-1] > 2 * waits[0], (waits, held))
        out = subprocess.run([LAMINA, "trace", trace, "--svg", trace + ".svg"], capture_output=True, text=True)
        result("lamina trace: the engines' queue times and the verdict", out.returncode == 0 and
               "queued in the replicas' engines p50" in out.stdout and "(6 of 6 requests reported)" in out.stdout
               and "the wait is inside the engines" in out.stdout, out.stdout + out.stderr)
        print("NOTE engine admit trace:\n" + out.stdout)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        result("engine admit: trace", False, e)
    finally:
        for f in (trace, trace + ".svg"):
            if os.path.exists(f):
                os.unlink(f)


# ------------------------------------------------------------ 5. affinity

SYSTEM = ("You are a storyteller who tells short, happy stories about animals in the forest, "
          "with a clear beginning, a middle and an end, for small children at bedtime. ")


def routed(rt, n, prompts):
    m0 = per_replica(rmetrics(rt), "lamina_router_replica_sent_total")
    for p in prompts:
        st, _, _ = es.post(rt, "/v1/completions", {"prompt": p, "max_tokens": 4}, timeout=60)
    m1 = per_replica(rmetrics(rt), "lamina_router_replica_sent_total")
    return sorted(m1[k] - m0.get(k, 0) for k in m1)


def check_affinity(rt):
    prompts = [SYSTEM + "Tell me about animal number %d." % i for i in range(8)]
    reps = [rt.replica(i) for i in range(rt.n)]
    hits0 = sum(es.metrics(r).get("lamina_prefix_cache_hits_total", 0) for r in reps)
    d = routed(rt, rt.n, prompts)
    result("prefix affinity: a shared prefix goes to one replica", d[-1] == 8, d)
    hits1 = sum(es.metrics(r).get("lamina_prefix_cache_hits_total", 0) for r in reps)
    result("prefix affinity: the replica's prefix cache hits", hits1 - hits0 >= 7, (hits0, hits1))
    m = rmetrics(rt)
    result("prefix affinity: hit rate reported", m.get("lamina_router_prefix_hit_rate", 0) > 0, m)
    other = [("Another long shared opening line that differs from the first one in every block, "
              "so that it keys other blocks of the cache entirely. Request %d." % i) for i in range(8)]
    d2 = routed(rt, rt.n, other)
    result("prefix affinity: a second prefix also sticks", d2[-1] == 8, d2)


def check_round_robin():
    rt = Router(2, "--policy", "round-robin")
    try:
        d = routed(rt, 2, [SYSTEM + "Tell me about animal number %d." % i for i in range(8)])
        result("round-robin: the same prefix spreads", d == [4, 4], d)
    finally:
        rt.stop("router (round-robin)")


# ------------------------------------------------------------- 6. api keys

def check_keys():
    rt = Router(1, "--api-key", "front", "--upstream-key", "back")
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 4}
        st = es.post(rt, "/v1/completions", body)[0]
        result("api key: 401 without it", st == 401, st)
        st = es.post(rt, "/v1/completions", body, headers={"Authorization": "Bearer front"})[0]
        result("api key: 200 with it (the router sends its own key upstream)", st == 200, st)
        st = es.post(rt.replica(0), "/v1/completions", body, headers={"Authorization": "Bearer front"})[0]
        result("upstream key: the replica refuses the client's key", st == 401, st)
        result("api key: /health open", es.get(rt, "/health")[0] == 200)
        # a model id is one path segment: dot segments, escaped or not, never reach the
        # replica's other routes (with the upstream key)
        auth = {"Authorization": "Bearer front"}
        st, _, b = es.get(rt, "/v1/models", headers=auth)
        mid = json.loads(b)["data"][0]["id"] if st == 200 else ""
        st = es.get(rt, "/v1/models/" + mid, headers=auth)[0]
        result("model id: the served model's page through the router", st == 200, "%s %s" % (st, mid))
        for path in ("/v1/models/../../metrics", "/v1/models/%2e%2e/%2e%2e/metrics", "/v1/models/..%2f..%2fmetrics",
                     "/v1/models/x/../../../health"):
            st, _, b = es.get(rt, path, headers=auth)
            result("model id: %s is 404, not another route" % path,
                   st == 404 and b"lamina_" not in b and b"status" not in b, "%s %r" % (st, b[:200]))
    finally:
        rt.stop("router (keys)")


# ------------------------------------------------------- 7. learnt admission

def check_learnt():
    trace = TRACE + ".learnt"
    rt = Router(1, "--trace", trace, "--poll-interval", "0.05", serve=SERVE + ["--max-seqs", "8"])
    try:
        todo = list(range(128))
        codes = []

        def worker():
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop()
                st = es.post(rt, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 96,
                                                      "ignore_eos": True, "seed": i}, timeout=120)[0]
                with lock:
                    codes.append(st)

        ts = [threading.Thread(target=worker) for _ in range(64)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        result("learnt: every request answered", codes.count(200) == 128, codes)
    finally:
        rt.stop("router (learnt)")
    try:
        samples = [json.loads(l) for l in open(trace)]
        samples = [x for x in samples if x["kind"] == "sample" and x["queue"] > 0]
        limits = [x["replicas"][0]["limit"] for x in samples]
        running = [x["replicas"][0]["running"] for x in samples]
        waiting = [x["replicas"][0]["waiting"] for x in samples]
        queue = [x["queue"] for x in samples]
        ok = samples and max(limits) >= 8 and max(running) == 8
        result("learnt: the limit grew to the engine's capacity (8 slots), all of them used", ok,
               (limits[:40], running[:40]))
        mean = lambda v: sum(v) / len(v) if v else 0  # noqa: E731
        result("learnt: the router held the work, the replica's queue stayed short",
               mean(queue) > mean(waiting) and max(limits) <= 64, (mean(queue), mean(waiting), max(limits)))
        out = subprocess.run([LAMINA, "trace", trace, "--svg", trace + ".svg"], capture_output=True, text=True)
        svg = open(trace + ".svg").read() if os.path.exists(trace + ".svg") else ""
        result("lamina trace: a summary naming the hops, and an SVG", out.returncode == 0 and
               "router held" in out.stdout and "engine batch mean" in out.stdout and "<polyline" in svg,
               out.stdout + out.stderr)
        print("NOTE learnt trace:\n" + out.stdout)
    except (OSError, ValueError, KeyError, IndexError) as e:
        result("learnt: trace samples", False, e)
    finally:
        for f in (trace, trace + ".svg"):
            if os.path.exists(f):
                os.unlink(f)


# ----------------------------------------------------------- 8. bad replicas

class Fake(testenv.FakeReplica):
    """A stand-in replica: /health 200, and a POST answered as `mode` says."""

    def __init__(self, mode):
        self.mode = mode
        super().__init__(self.answer)

    def answer(self, h):
        if self.mode == "hang":
            time.sleep(30)
            return
        if self.mode == "slow-whole":  # a whole answer, later than a 1 s first-byte deadline
            time.sleep(2)
            body = b'{"object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}'
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
            return
        if self.mode in ("garbage", "huge"):
            body = b"<html>not JSON</html>" if self.mode == "garbage" else b'{"x":"' + b"a" * (5 << 20) + b'"}'
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            try:
                h.wfile.write(body)
            except OSError:
                pass
            return
        h.send_response(200)
        if self.mode == "cut-stream":
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            ev = b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
            h.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev))
            h.wfile.flush()
            time.sleep(0.5)  # the router has passed the first event on: no retry now
        else:  # cut-body: promise more than is sent
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", "1000")
            h.end_headers()
            h.wfile.write(b'{"choices":[')
        h.wfile.flush()
        h.close_connection = True
        h.connection.shutdown(socket.SHUT_RDWR)


class Front:
    """`lamina route` over given URLs only (no spawned replicas)."""

    def __init__(self, urls, *args):
        cmd = [LAMINA, "route", "--port", "0", *args]
        for u in urls:
            cmd += ["--replica", u]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines = []
        got = threading.Event()
        self.port = None

        def reader():
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.lines.append(line)
                m = re.search(r"lamina route: listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    got.set()
            got.set()

        self.reader = threading.Thread(target=reader, daemon=True)
        self.reader.start()
        got.wait(60)
        if self.port is None:
            raise RuntimeError("router did not start: %s" % self.lines)
        Router.wait_healthy(self, len(urls), 60)

    def stop(self, name):
        self.pids = {}
        Router.stop(self, name)


def check_bad_replicas():
    cut, body_cut, hang = Fake("cut-stream"), Fake("cut-body"), Fake("hang")
    garbage, huge = Fake("garbage"), Fake("huge")
    fronts = []
    try:
        f = Front([cut.url], "--max-attempts", "2", "--trace", TRACE + ".fake")
        fronts.append(f)
        st, _, events = stream(f, {"prompt": "x", "max_tokens": 4, "stream": True}, timeout=60)
        result("cut stream: ends with an error event and [DONE]", st == 200 and len(events) >= 3 and
               events[-1] == "[DONE]" and json.loads(events[-2]).get("error") and "choices" in events[0],
               (st, events))
        f.stop("router (bad replicas trace)")
        fronts.remove(f)
        try:
            reqs = [r for r in map(json.loads, open(TRACE + ".fake")) if r["kind"] == "req"]
            result("trace: engine_admit null when the replica did not report it",
                   len(reqs) == 1 and "engine_admit" in reqs[0] and reqs[0]["engine_admit"] is None, reqs)
        except (OSError, ValueError) as e:
            result("trace: engine_admit null when the replica did not report it", False, e)
        finally:
            if os.path.exists(TRACE + ".fake"):
                os.unlink(TRACE + ".fake")
        f2 = Front([body_cut.url], "--max-attempts", "2")
        fronts.append(f2)
        st, _, body = es.post(f2, "/v1/completions", {"prompt": "x", "max_tokens": 4}, timeout=60)
        result("cut body: 502 with an error object, after a retry", st == 502 and "error" in json.loads(body) and
               body_cut.posts == 2, (st, body, body_cut.posts))
        # a replica that never answers, beside a real one: given up on, ejected, retried on the real one
        rt = Router(1, "--replica", hang.url, "--timeout", "2", "--policy", "round-robin")
        fronts.append(rt)
        t0 = time.time()
        codes = []
        for i in range(4):
            codes.append(es.post(rt, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4},
                                 timeout=60)[0])
        m = rmetrics(rt)
        ej = per_replica(m, "lamina_router_replica_ejections_total")
        result("hanging replica: every request answered by the good one", codes == [200] * 4 and hang.posts >= 1,
               (codes, hang.posts, time.time() - t0))
        result("hanging replica: ejected and retried", ej.get(hang.url, 0) >= 1 and
               m.get("lamina_router_requests_retried_total", 0) >= 1, (ej, m.get("lamina_router_requests_retried_total")))
        rt.stop("router (hanging replica, timeout)")
        fronts.remove(rt)
        # the same without a transfer timeout: the stall detector (no engine iteration for 2 s
        # with requests in flight) ejects it, retries its requests, and keeps it out a while
        posts0 = hang.posts
        rt = Router(1, "--replica", hang.url, "--stall-timeout", "2", "--policy", "round-robin")
        fronts.append(rt)
        t0 = time.time()
        codes = []
        for i in range(6):
            codes.append(es.post(rt, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4},
                                 timeout=60)[0])
        took = time.time() - t0
        m = rmetrics(rt)
        ej = per_replica(m, "lamina_router_replica_ejections_total")
        result("stalled replica: every request answered within seconds, not the 600 s timeout",
               codes == [200] * 6 and took < 30, (codes, "%.1f s" % took))
        # answers that are not JSON, or too large to hold: retried on the real replica, and the
        # faulty one ejected after 3 in a row (then kept out)
        for fake, what in ((garbage, "not JSON"), (huge, "over 4 MiB")):
            rt2 = Router(1, "--replica", fake.url, "--policy", "round-robin")
            fronts.append(rt2)
            codes = [es.post(rt2, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4}, timeout=60)[0]
                     for _ in range(8)]
            m2 = rmetrics(rt2)
            ej2 = per_replica(m2, "lamina_router_replica_ejections_total")
            result("answers %s: every request answered by the real replica" % what, codes == [200] * 8, codes)
            result("answers %s: the replica ejected after 3 in a row, then kept out" % what,
                   ej2.get(fake.url, 0) >= 1 and 3 <= fake.posts <= 4, (ej2, fake.posts))
        f3 = Front([huge.url], "--max-attempts", "2")
        fronts.append(f3)
        st, _, body = es.post(f3, "/v1/completions", {"prompt": "x", "max_tokens": 4}, timeout=60)
        result("answer over 4 MiB alone: 502 naming the replica's answer, not the client", st == 502 and
               b"4 MiB" in body and b"did not read" not in body, (st, body[:200]))
        result("stalled replica: ejected once, its request retried, kept out (at most 2 posts)",
               ej.get(hang.url, 0) >= 1 and m.get("lamina_router_requests_retried_total", 0) >= 1 and
               1 <= hang.posts - posts0 <= 2, (ej, m.get("lamina_router_requests_retried_total"), hang.posts - posts0))
    finally:
        for i, f in enumerate(fronts):
            f.stop("router (bad replicas %d)" % i)
        for x in (cut, body_cut, hang, garbage, huge):
            x.close()


FIRST_BYTE = "1"  # the deadline the checks below give the router


def check_first_byte():
    hang, slow = Fake("hang"), Fake("slow-whole")
    fronts = []
    timeouts = "lamina_router_replica_first_byte_timeouts_total"
    try:
        # beside a real replica: each stream that goes to the silent one first is retried on the real one
        rt = Router(1, "--replica", hang.url, "--first-byte-timeout", FIRST_BYTE, "--policy", "round-robin")
        fronts.append(rt)
        took, bad, limit_after_one = [], [], None
        for i in range(6):
            t0 = time.time()
            st, _, events = stream(rt, {"prompt": "Once upon a time", "max_tokens": 8, "stream": True, "seed": i},
                                   timeout=60)
            took.append(round(time.time() - t0, 1))
            if st != 200 or events[-1:] != ["[DONE]"] or any(e.startswith('{"error"') for e in events):
                bad.append((i, st, events[-2:]))
            if limit_after_one is None and hang.posts == 1:
                limit_after_one = per_replica(rmetrics(rt), "lamina_router_replica_limit").get(hang.url)
        m = rmetrics(rt)
        n = per_replica(m, timeouts)
        print("NOTE first byte: streams took %s s; %d sent to the silent replica" % (took, hang.posts))
        result("first byte: every stream answered by the real replica within seconds",
               not bad and hang.posts >= 1 and max(took) < 6, (bad, took, hang.posts))
        result("first byte: each attempt at the silent replica counted in /metrics, and retried",
               n.get(hang.url) == hang.posts and sum(n.values()) == hang.posts and
               m.get("lamina_router_requests_retried_total", 0) >= hang.posts, (n, hang.posts, m))
        result("first byte: the first timeout halves the silent replica's limit (4 to 2)", limit_after_one == 2,
               limit_after_one)
        rt.stop("router (first byte, two replicas)")
        fronts.remove(rt)
        # the silent replica alone: nowhere else to go, 504 naming it
        posts0 = hang.posts
        f = Front([hang.url], "--first-byte-timeout", FIRST_BYTE)
        fronts.append(f)
        t0 = time.time()
        try:
            st, _, body = es.post(f, "/v1/completions", {"prompt": "x", "max_tokens": 4, "stream": True}, timeout=20)
        except (OSError, http.client.HTTPException) as e:
            st, body = type(e).__name__, b""
        took = time.time() - t0
        try:
            err = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            err = {}
        result("first byte: alone, the client gets 504 naming the replica, within seconds",
               st == 504 and hang.url in err.get("message", "") and err.get("type") == "server_error" and
               took < 6 and hang.posts - posts0 == 1, (st, body[:300], "%.1f s" % took))
        result("first byte: alone, the timeout counted", per_replica(rmetrics(f), timeouts).get(hang.url) == 1,
               per_replica(rmetrics(f), timeouts))
        # a whole answer sends its first byte with its end: no first-byte deadline
        f2 = Front([slow.url], "--first-byte-timeout", FIRST_BYTE)
        fronts.append(f2)
        st, _, body = es.post(f2, "/v1/completions", {"prompt": "x", "max_tokens": 4}, timeout=60)
        result("first byte: a whole answer slower than the deadline is not cut",
               st == 200 and slow.posts == 1 and not any(per_replica(rmetrics(f2), timeouts).values()),
               (st, body[:200], slow.posts))
    finally:
        for i, f in enumerate(fronts):
            f.stop("router (first byte %d)" % i)
        for x in (hang, slow):
            x.close()


def check_shutdown():
    """SIGTERM with requests queued and in flight, past a short --drain-timeout: each client gets
    an end (200 for what finished in time, 503 for the rest), the router exits 0. (The drain
    itself: tests/e2e_shutdown.py.)"""
    rt = Router(1, "--max-inflight-per-replica", "1", "--drain-timeout", "0.2")
    ends = []

    def one(i):
        try:
            st = es.post(rt, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 800,
                                                  "ignore_eos": True, "seed": i}, timeout=60)[0]
        except (OSError, http.client.HTTPException) as e:
            st = type(e).__name__
        with lock:
            ends.append(st)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    deadline = time.time() + 30
    while time.time() < deadline:  # every client in (a later one would find the port closed), 3 queued
        m = rmetrics(rt)
        if m.get("lamina_router_requests_admitted_total", 0) >= 6 and m.get("lamina_router_queue_depth", 0) >= 3:
            break
        time.sleep(0.02)
    t0 = time.time()
    rt.stop("router (shutdown under load)")
    for t in ts:
        t.join(60)
    result("shutdown: every client got an end, none hung", len(ends) == 6 and not any(t.is_alive() for t in ts)
           and time.time() - t0 < 30 and set(ends) <= {200, 503} and 503 in ends, ends)


def check_conn_limits():
    """--max-connections-per-ip and --idle-timeout: one address's idle sockets past its limit
    are closed at once, the rest after the idle timeout (4 s), and a client at another address is
    served meanwhile."""
    rt = Router(1, "--max-connections-per-ip", "4", "--idle-timeout", "4", "--read-timeout", "2")
    socks = []
    try:
        for _ in range(8):
            s = socket.socket()
            s.bind(("127.0.0.5", 0))
            s.settimeout(5)
            s.connect(("127.0.0.1", rt.port))
            socks.append(s)
        time.sleep(0.3)

        def closed(s, wait):
            s.settimeout(wait)
            try:
                return s.recv(1) == b""
            except socket.timeout:
                return False
            except OSError:
                return True

        early = sum(closed(s, 0.1) for s in socks)
        st = es.post(rt, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4})[0]
        result("per-address limit: 4 of 8 idle sockets from one address closed at once", early == 4, early)
        result("per-address limit: another address is served meanwhile", st == 200, st)
        t0 = time.time()
        late = sum(closed(s, 10) for s in socks)
        result("idle timeout: the other 4 closed after about 4 s", late == 8 and time.time() - t0 < 10,
               "%d closed in %.1f s" % (late, time.time() - t0))
        # a request trickled a byte every 0.3 s is never idle, but its read deadline (2 s) closes it
        s = socket.socket()
        s.bind(("127.0.0.6", 0))
        s.connect(("127.0.0.1", rt.port))
        socks.append(s)
        t0 = time.time()
        closed_at = None
        for ch in b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b" " * 100:
            try:
                s.send(bytes([ch]))
            except OSError:
                closed_at = time.time() - t0
                break
            if closed(s, 0.3):
                closed_at = time.time() - t0
                break
        result("read deadline: a trickled request closed after about 2 s", closed_at is not None and
               1.5 <= closed_at <= 8, closed_at)
        m = rmetrics(rt)
        result("read deadline: counted in /metrics", m.get("lamina_router_http_read_timeouts_total", 0) >= 1,
               m.get("lamina_router_http_read_timeouts_total"))
    finally:
        for s in socks:
            s.close()
        rt.stop("router (connection limits)")


TRACE = os.path.join(os.environ.get("TMPDIR", "/tmp"), "lamina_e2e_router_%d.trace" % os.getpid())


def main():
    if not os.path.exists(LAMINA):
        result("a lamina binary at %s" % LAMINA, False)
        return summary()
    routers = []
    t0 = time.time()
    try:
        rt = Router(2)
        routers.append(rt)
        for part in (lambda: check_basics(rt), lambda: check_client(rt), lambda: check_affinity(rt),
                     lambda: check_disconnect(rt), lambda: check_kill(rt), check_queue_bound, check_engine_admit,
                     check_round_robin,
                     check_keys, check_conn_limits, check_learnt, check_bad_replicas, check_first_byte,
                     check_shutdown):
            t1 = time.time()
            part()
            print("NOTE part done in %.1f s" % (time.time() - t1))
    except Exception:
        import traceback
        result("e2e_router ran to the end", False, traceback.format_exc())
    finally:
        for i, r in enumerate(routers):
            r.stop("router %d" % i)
        if os.path.exists(TRACE):
            os.unlink(TRACE)
    print("NOTE e2e_router: %.1f s" % (time.time() - t0))
    return summary()


if __name__ == "__main__":
    sys.exit(main())
