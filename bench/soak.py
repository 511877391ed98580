#!/usr/bin/env python3
"""soak.py - a long constant load on `lamina serve`, watching for leaks and drift.

Not part of `make test`. Starts `lamina serve` on a model (default the bundled
models/stories260K.gguf) on a free port, then keeps K client threads busy for
--minutes. Each client sends one request after another: /v1/completions
(sometimes two prompts in one request, sometimes echo) or, for a share,
/v1/chat/completions (the server gets --chat-template, default chatml);
a random prompt (1 .. a quarter of the context in words), random max_tokens
(1 .. a quarter of the context), streaming (with or without the usage chunk)
or not, n = 1 or sometimes 2, greedy or sampled, with logprobs or stop
strings for some. Some requests are cut short on purpose:
  - disconnect: a stream whose client closes the socket after a few events;
  - cancel: a non-streaming request whose client goes away before the answer.
Every minute it prints a row: the server's VmRSS and VmHWM (/proc/PID/status),
requests that ended in the minute, completed ones, errors by kind (intended:
disconnect, cancel, and a 400 context_length_exceeded the random lengths may
cause; unintended: anything else - another status, a malformed or truncated
answer, a timeout, a connection error), p50/p99 end-to-end latency of the
completed requests, tokens generated and preemptions in the minute.

At the end the load stops and it prints a verdict, each line PASS or FAIL:
  - RSS flat: every minute from the third on has VmRSS within --rss-margin
    (default 5%) or --rss-slack MiB (default 1), whichever is larger, of
    minute 2's (minute 1 is the warm-up);
  - no unintended errors;
  - p99 stable: the last minute's p99 is at most --p99-factor (default 2)
    times minute 2's;
  - /metrics once idle: nothing running or waiting, every KV block free
    (lamina_kv_blocks_free == lamina_kv_blocks_total, the local class too).
Exit status 0 when every line passes. --out FILE writes the table and the
verdict as Markdown too.

RSS and glibc: the HTTP library runs a thread per connection, and glibc's
malloc gives threads their own arenas (up to 8 per core), each keeping the
memory its own peak needed, so RSS can creep up for a long while as the
arenas fill, without a leak.
To tell that from a leak, run the same load with MALLOC_ARENA_MAX=1 in the
environment (the server inherits it): a leak still grows, arenas do not.

  python3 bench/soak.py --minutes 10 --clients 16 --kv-mem 160K
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

WORDS = ("once upon a time there was a little girl named lily she liked to play in the park with her dog "
         "one day the sun was shining and they went to see the big tree by the river ben said hello and "
         "mom smiled they were happy").split()

INTENDED = ("disconnect", "cancel", "too_long")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lamina", default=os.environ.get("LAMINA_BIN", "build/lamina"))
    ap.add_argument("-m", "--model", default="models/stories260K.gguf")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    ap.add_argument("--threads", type=int, default=1, help="the server's -t (default 1)")
    ap.add_argument("--kv-mem", default=None, help="the server's --kv-mem (default: its own)")
    ap.add_argument("--chat-template", default="chatml",
                    help="the server's --chat-template (default chatml; '' for the model's own)")
    ap.add_argument("--chat", type=float, default=0.2, help="share of chat requests (default 0.2)")
    ap.add_argument("--disconnect", type=float, default=0.1, help="share of streams closed mid-way (default 0.1)")
    ap.add_argument("--cancel", type=float, default=0.05,
                    help="share of non-streaming requests abandoned before the answer (default 0.05)")
    ap.add_argument("--rss-margin", type=float, default=0.05)
    ap.add_argument("--rss-slack", type=float, default=1.0, help="MiB")
    ap.add_argument("--p99-factor", type=float, default=2.0)
    ap.add_argument("--minute", type=float, default=60.0, help="seconds per report row (default 60)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--nice", type=int, default=0, help="run the server under nice -n N")
    ap.add_argument("--out", default=None, help="also write the table and verdict here (Markdown)")
    ap.add_argument("serve_args", nargs="*", help="more arguments for lamina serve (after --)")
    return ap.parse_args()


class Server:
    def __init__(self, a):
        cmd = [a.lamina, "serve", "-m", a.model, "--port", "0", "-t", str(a.threads)]
        if a.kv_mem:
            cmd += ["--kv-mem", a.kv_mem]
        if a.chat_template:
            cmd += ["--chat-template", a.chat_template]
        cmd += a.serve_args
        if a.nice:
            cmd = ["nice", "-n", str(a.nice)] + cmd  # nice execs lamina: the same pid
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines, self.port, self.ctx = [], None, None
        ready = threading.Event()

        def reader():
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.lines.append(line)
                m = re.search(r"listening on http://[^ ]*:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                m = re.search(r"ready in .*\(context (\d+)\)", line)
                if m:
                    self.ctx = int(m.group(1))
                    ready.set()
            ready.set()

        self.reader = threading.Thread(target=reader, daemon=True)
        self.reader.start()
        ready.wait(300)
        if not self.port or not self.ctx:
            self.stop()
            raise SystemExit("lamina serve did not start:\n" + "\n".join(self.lines))

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def metrics(self):
        out = {}
        for line in self.get("/metrics")[1].decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def memory(self):
        """(VmRSS, VmHWM) in KiB."""
        got = {}
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    got[k] = int(v.split()[0])
        return got.get("VmRSS", 0), got.get("VmHWM", 0)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


# ------------------------------------------------------------------ clients

def one_request(srv, rng, a):
    """One request; returns (kind, seconds). kind: ok, disconnect, cancel,
    too_long, or an unintended kind."""
    def text():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max(1, srv.ctx // 4))))

    chat = rng.random() < a.chat
    body = {"max_tokens": rng.randint(1, max(1, srv.ctx // 4)),
            "temperature": rng.choice((0.0, 0.8)), "seed": rng.randrange(1 << 30),
            "ignore_eos": rng.random() < 0.5}
    n_prompts = 1
    if chat:
        body["messages"] = [{"role": "user", "content": text()}]
    elif rng.random() < 0.05:
        body["prompt"] = [text(), text()]
        n_prompts = 2
    else:
        body["prompt"] = text()
    if rng.random() < 0.15:
        body["n"] = 2
    if rng.random() < 0.1:
        if chat:
            body["logprobs"], body["top_logprobs"] = True, rng.randint(0, 3)
        else:
            body["logprobs"] = rng.randint(0, 3)
    elif not chat and rng.random() < 0.05:
        body["echo"] = True
    if rng.random() < 0.15:
        body["stop"] = rng.sample(["the", "\n", ".", "dog", "e"], rng.randint(1, 2))
    stream = rng.random() < 0.5
    if stream:
        body["stream"] = True
        if rng.random() < 0.3:
            body["stream_options"] = {"include_usage": True}
    cut_after = rng.randint(1, 8) if stream and rng.random() < a.disconnect else None
    abandon = rng.uniform(0.01, 0.5) if not stream and rng.random() < a.cancel else None
    n = body.get("n", 1) * n_prompts
    path = "/v1/chat/completions" if chat else "/v1/completions"
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=300)
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        if abandon is not None:
            time.sleep(abandon)
            c.sock.shutdown(socket.SHUT_RDWR)
            return "cancel", time.monotonic() - t0
        r = c.getresponse()
        if r.status != 200:
            data = r.read()
            try:
                code = json.loads(data)["error"].get("code")
            except (ValueError, KeyError, TypeError, AttributeError):
                return "bad_error_body_%d" % r.status, time.monotonic() - t0
            if r.status == 400 and code == "context_length_exceeded":
                return "too_long", time.monotonic() - t0
            return "http_%d%s" % (r.status, "_" + code if code else ""), time.monotonic() - t0
        if not stream:
            j = json.loads(r.read())
            ok = len(j["choices"]) == n and all(ch["finish_reason"] in ("stop", "length") for ch in j["choices"])
            return ("ok" if ok else "bad_answer"), time.monotonic() - t0
        finished, events = set(), 0
        for raw in r:
            line = raw.decode().rstrip("\n")
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return ("ok" if len(finished) == n else "stream_unfinished"), time.monotonic() - t0
            j = json.loads(line[6:])
            if "error" in j:
                return "stream_error", time.monotonic() - t0
            for ch in j.get("choices", []):
                if ch.get("finish_reason"):
                    finished.add(ch["index"])
            events += 1
            if cut_after is not None and events >= cut_after:
                c.sock.shutdown(socket.SHUT_RDWR)
                return "disconnect", time.monotonic() - t0
        return "stream_truncated", time.monotonic() - t0
    except socket.timeout:
        return "timeout", time.monotonic() - t0
    except (OSError, ValueError, KeyError, http.client.HTTPException) as e:
        return "exception_" + type(e).__name__, time.monotonic() - t0
    finally:
        c.close()


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def main():
    a = parse_args()
    srv = Server(a)
    env = " ".join("%s=%s" % (k, os.environ[k]) for k in ("MALLOC_ARENA_MAX",) if k in os.environ)
    print("soak: %s%s" % (env + " " if env else "", " ".join(srv.cmd)))
    print("soak: %d clients for %g minutes, context %d, port %d, pid %d" % (a.clients, a.minutes, srv.ctx, srv.port,
                                                                            srv.proc.pid))
    sys.stdout.flush()
    done = []            # (end time, kind, seconds)
    lock = threading.Lock()
    stop = threading.Event()

    def client(k):
        rng = random.Random(a.seed * 1000 + k)
        while not stop.is_set():
            kind, secs = one_request(srv, rng, a)
            with lock:
                done.append((time.monotonic(), kind, secs))

    ts = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(a.clients)]
    t_start = time.monotonic()
    for t in ts:
        t.start()
    rows = []
    head = ("| min | VmRSS MiB | VmHWM MiB | ended | completed | intended (disc/cancel/too long) | unintended | "
            "p50 s | p99 s | tokens | preempt |")
    print(head)
    print("|" + "---|" * 11)
    prev_m = srv.metrics()
    n_min = max(1, int(round(a.minutes * 60 / a.minute)))
    for minute in range(1, n_min + 1):
        until = t_start + minute * a.minute
        while time.monotonic() < until and srv.proc.poll() is None:
            time.sleep(min(1.0, max(0.0, until - time.monotonic())))
        if srv.proc.poll() is not None:
            print("soak: the server exited with %s during minute %d" % (srv.proc.returncode, minute))
            break
        rss, hwm = srv.memory()
        m = srv.metrics()
        with lock:
            window = [d for d in done if until - a.minute <= d[0] < until]
        kinds = {}
        for _, k, _ in window:
            kinds[k] = kinds.get(k, 0) + 1
        lat = [s for _, k, s in window if k == "ok"]
        unintended = {k: v for k, v in kinds.items() if k != "ok" and k not in INTENDED}
        row = {"minute": minute, "rss": rss / 1024.0, "hwm": hwm / 1024.0, "ended": len(window),
               "ok": kinds.get("ok", 0), "intended": [kinds.get(k, 0) for k in INTENDED], "unintended": unintended,
               "p50": percentile(lat, 50), "p99": percentile(lat, 99),
               "tokens": m.get("lamina_generation_tokens_total", 0) - prev_m.get("lamina_generation_tokens_total", 0),
               "preempt": m.get("lamina_preemptions_total", 0) - prev_m.get("lamina_preemptions_total", 0)}
        prev_m = m
        rows.append(row)
        print(fmt_row(row))
        sys.stdout.flush()
    stop.set()
    for t in ts:
        t.join(330)
    lines = verdict(a, srv, rows, done)
    print()
    for ln in lines:
        print(ln)
    rc = srv.stop()
    ok = all(ln.startswith("PASS") for ln in lines) and rc == 0
    print("soak: server exit status %d; verdict %s" % (rc, "PASS" if ok else "FAIL"))
    if a.out:
        with open(a.out, "w") as f:
            f.write(head + "\n|" + "---|" * 11 + "\n")
            for r in rows:
                f.write(fmt_row(r) + "\n")
            f.write("\n" + "\n".join("- " + ln for ln in lines) + "\n")
    return 0 if ok else 1


def fmt_row(r):
    un = ", ".join("%s %d" % kv for kv in sorted(r["unintended"].items())) or "0"
    return "| %d | %.2f | %.2f | %d | %d | %d / %d / %d | %s | %.3f | %.3f | %d | %d |" % (
        r["minute"], r["rss"], r["hwm"], r["ended"], r["ok"], r["intended"][0], r["intended"][1], r["intended"][2], un,
        r["p50"], r["p99"], r["tokens"], r["preempt"])


def verdict(a, srv, rows, done):
    lines = []
    if len(rows) < 3:
        return ["FAIL fewer than 3 minutes ran (%d): no verdict on RSS or p99" % len(rows)]
    base = rows[1]
    limit = max(base["rss"] * (1 + a.rss_margin), base["rss"] + a.rss_slack)
    worst = max(rows[2:], key=lambda r: r["rss"])
    lines.append("%s RSS flat: minutes 3-%d at most %.2f MiB (minute %d), minute 2 %.2f MiB, limit %.2f MiB "
                 "(+%g%% or +%g MiB)" % ("PASS" if worst["rss"] <= limit else "FAIL", rows[-1]["minute"],
                                         worst["rss"], worst["minute"], base["rss"], limit, a.rss_margin * 100,
                                         a.rss_slack))
    un = {}
    for _, k, _ in done:
        if k != "ok" and k not in INTENDED:
            un[k] = un.get(k, 0) + 1
    total = len(done)
    inten = sum(1 for _, k, _ in done if k in INTENDED)
    lines.append("%s no unintended errors: %d requests, %d completed, %d intended cuts or refusals, unintended %s" % (
        "PASS" if not un else "FAIL", total, sum(1 for _, k, _ in done if k == "ok"), inten,
        ", ".join("%s %d" % kv for kv in sorted(un.items())) or "none"))
    last = rows[-1]
    ok = last["p99"] <= base["p99"] * a.p99_factor
    lines.append("%s p99 stable: last minute %.3f s, minute 2 %.3f s (ratio %.2f, limit %g)" % (
        "PASS" if ok else "FAIL", last["p99"], base["p99"], last["p99"] / base["p99"] if base["p99"] else 0,
        a.p99_factor))
    deadline = time.monotonic() + 60
    m = {}
    while time.monotonic() < deadline:
        m = srv.metrics()
        if m.get("lamina_requests_running") == 0 and m.get("lamina_requests_waiting") == 0 and \
                m.get("lamina_kv_blocks_used") == 0:
            break
        time.sleep(0.1)
    free_ok = m.get("lamina_kv_blocks_free") == m.get("lamina_kv_blocks_total") and \
        m.get("lamina_kv_local_blocks_free", 0) == m.get("lamina_kv_local_blocks_total", 0)
    idle = m.get("lamina_requests_running") == 0 and m.get("lamina_requests_waiting") == 0
    lines.append("%s /metrics once idle: %d running, %d waiting, KV blocks free %d of %d (%d cached), "
                 "%d requests finished of %d, %d preemptions in all" % (
                     "PASS" if free_ok and idle else "FAIL", m.get("lamina_requests_running", -1),
                     m.get("lamina_requests_waiting", -1), m.get("lamina_kv_blocks_free", -1),
                     m.get("lamina_kv_blocks_total", -1), m.get("lamina_kv_blocks_cached", -1),
                     m.get("lamina_requests_finished_total", -1), m.get("lamina_requests_total", -1),
                     m.get("lamina_preemptions_total", -1)))
    return lines


if __name__ == "__main__":
    sys.exit(main())
