#!/usr/bin/env python3
"""lockout.py - can idle, silent and slow connections lock a client out of `lamina serve`
or `lamina route`?

Not part of `make test`. Starts `lamina serve` (or, with --route, `lamina route --spawn 1`)
on the bundled model with its default connection limits, then:

  1. idle: 10 completions (4 tokens) from 127.0.0.9, one after another: their latency;
  2. attack: --addresses A addresses (127.0.1.1 and up), each holding --per-address N
     connections of --kind silent (connect, send nothing), idle (one GET /health kept
     alive, then nothing) or slow (a request's headers, a byte every second), or mixed
     (a third of each); a connection the server closes is opened again --reopen-after
     seconds later (default 1; 0 makes it a flood of new connections, which no accept loop
     outruns on the same two cores);
  3. while the attack holds, 10 completions from 127.0.0.9 again, each with a 10 s timeout.

Prints the idle median, then how many of the 10 were answered under attack and their
median and largest latency, against the bound 2 x idle median + 0.25 s, and the server's
connection counters. Exit status 0 when at least 9 of 10 were answered within the bound.

    python3 bench/lockout.py --addresses 4 --per-address 600 --kind mixed
    python3 bench/lockout.py --addresses 20 --per-address 500 --kind silent
"""
import argparse
import http.client
import json
import os
import re
import resource
import select
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def start(lamina, model, route):
    if route:
        args = [lamina, "route", "--spawn", "1", "-m", model, "--port", "0"]
        pat = r"lamina route: listening on http://127\.0\.0\.1:(\d+)"
    else:
        args = [lamina, "serve", "-m", model, "--port", "0"]
        pat = r"listening on http://127\.0\.0\.1:(\d+)"
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    port = None
    for raw in proc.stderr:
        m = re.search(pat, raw.decode("utf-8", "replace"))
        if m:
            port = int(m.group(1))
            break
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.1)
    return proc, port


def complete(port, timeout=10):
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=("127.0.0.9", 0))
    try:
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": "Once upon a time", "max_tokens": 4}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        return r.status == 200, time.time() - t0
    except OSError:
        return False, time.time() - t0
    finally:
        c.close()


class Attacker(threading.Thread):
    """One address holding n connections of a kind, reopening what the server closes."""

    def __init__(self, port, addr, n, kind, stop, reopen):
        super().__init__(daemon=True)
        self.port, self.addr, self.n, self.kind, self.stop, self.reopen = port, addr, n, kind, stop, reopen
        self.opened = 0

    def open_one(self, kind):
        s = socket.socket()
        s.setblocking(False)
        s.bind((self.addr, 0))
        try:
            s.connect(("127.0.0.1", self.port))
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            return None
        self.opened += 1
        return [s, kind, 0]

    def run(self):
        kinds = ["silent", "idle", "slow"]
        conns = []
        i = 0
        while len(conns) < self.n and not self.stop.is_set():
            k = self.kind if self.kind != "mixed" else kinds[i % 3]
            c = self.open_one(k)
            i += 1
            if c:
                conns.append(c)
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"
        pending = []  # (when, kind) of connections to open again
        while not self.stop.is_set():
            poller = select.poll()  # (select() stops at descriptor 1024)
            by_fd = {}
            for c in conns:
                poller.register(c[0], select.POLLIN)
                by_fd[c[0].fileno()] = c[0]
            r = [by_fd[fd] for fd, _ in poller.poll(1000)]
            dead = set()
            for s in r:
                try:
                    if not s.recv(65536):
                        dead.add(s)
                except BlockingIOError:
                    pass
                except OSError:
                    dead.add(s)
            for c in conns:
                s, kind, sent = c
                if s in dead:
                    continue
                try:
                    if kind == "idle" and sent == 0:
                        s.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                        c[2] = 1
                    elif kind == "slow" and sent < len(head):
                        s.send(head[sent:sent + 1])
                        c[2] = sent + 1
                except BlockingIOError:
                    pass
                except OSError:
                    dead.add(s)
            keep = []
            now = time.time()
            for c in conns:
                if c[0] in dead:
                    c[0].close()
                    pending.append((now + self.reopen, c[1]))
                else:
                    keep.append(c)
            due = [p for p in pending if p[0] <= now]
            pending = [p for p in pending if p[0] > now]
            for _, kind in due:
                nc = self.open_one(kind)
                if nc:
                    keep.append(nc)
            conns = keep
        for c in conns:
            c[0].close()


def metrics(port):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=("127.0.0.9", 0))
        c.request("GET", "/metrics")
        body = c.getresponse().read().decode()
        c.close()
    except OSError:
        return {}
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lamina", default=os.path.join(ROOT, "build", "lamina"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "stories260K.gguf"))
    ap.add_argument("--route", action="store_true", help="attack `lamina route --spawn 1` instead of serve")
    ap.add_argument("--addresses", type=int, default=4)
    ap.add_argument("--per-address", type=int, default=600)
    ap.add_argument("--kind", choices=["silent", "idle", "slow", "mixed"], default="mixed")
    ap.add_argument("--hold", type=float, default=5, help="seconds the attack runs before measuring")
    ap.add_argument("--reopen-after", type=float, default=1.0,
                    help="seconds before a closed connection is opened again (0: at once, a flood)")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = a.addresses * a.per_address + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    proc, port = start(a.lamina, a.model, a.route)
    try:
        idle = sorted(complete(port)[1] for _ in range(10))
        idle_med = idle[5]
        stop = threading.Event()
        atk = [Attacker(port, "127.0.1.%d" % (i + 1), a.per_address, a.kind, stop, a.reopen_after)
               for i in range(a.addresses)]
        for t in atk:
            t.start()
        time.sleep(a.hold)
        res = [complete(port) for _ in range(10)]
        m = metrics(port)
        stop.set()
        for t in atk:
            t.join(10)
    finally:
        proc.terminate()
        proc.wait(30)
    bound = 2 * idle_med + 0.25
    ok = [t for good, t in res if good]
    within = sum(1 for good, t in res if good and t <= bound)
    lat = sorted(ok)
    print("target: %s, attack: %d addresses x %d %s connections, reopened after %g s (%d opened in all)" %
          ("route" if a.route else "serve", a.addresses, a.per_address, a.kind, a.reopen_after,
           sum(t.opened for t in atk)))
    print("idle: median %.3f s; bound 2 x idle + 0.25 = %.3f s" % (idle_med, bound))
    print("under attack: %d of 10 answered, %d within the bound; median %s s, largest %s s" %
          (len(ok), within, "%.3f" % lat[len(lat) // 2] if lat else "-", "%.3f" % lat[-1] if lat else "-"))
    keys = [k for k in m if re.match(r"lamina_(router_)?http_", k)]
    print("server: " + ", ".join("%s %g" % (k, m[k]) for k in sorted(keys)))
    return 0 if within >= 9 else 1


if __name__ == "__main__":
    sys.exit(main())
