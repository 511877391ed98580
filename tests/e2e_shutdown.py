#!/usr/bin/env python3
"""`lamina serve` stopped by a signal while requests run (tools/cmd_serve.c).

  1. Graceful: a stream and a whole request run when SIGINT comes. New connections are
     refused from then on; both requests finish whole (every token asked, finish_reason
     "length", the stream's [DONE]); the server then exits 0 and said how many requests
     it was finishing.
  2. The deadline: --drain-timeout 0.5 and requests far longer than that, stopped by
     SIGTERM. The stream ends with an error event naming the shutdown and [DONE]; the
     whole request gets 503 with an OpenAI error object; the server exits 0.
  3. A second SIGINT while draining (--drain-timeout 600) cancels at once: both requests
     get the same answers as in 2, and the server exits within seconds, not 600.
  4. `lamina route --spawn 1` drains the same way: SIGINT with a stream and a whole request
     in flight through it; new connections refused, both finish whole, exit 0.
On the bundled model (models/stories260K.gguf), with a context stretched to 4096.
"""
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testenv  # noqa: E402
from testenv import result  # noqa: E402

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
MODEL = "models/stories260K.gguf"
ASAN = bool(os.environ.get("LAMINA_ASAN"))
ARGS = ["-c", "4096", "--ctx-extend", "--max-seqs", "32", "-t", "1"]


def note(text):
    print("NOTE", text)
    sys.stdout.flush()


class Whole(threading.Thread):
    """A non-streaming completion in a thread: .status, .body once joined."""

    def __init__(self, port, body):
        super().__init__(daemon=True)
        self.port, self.body, self.status, self.reply = port, body, None, None

    def run(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            c.request("POST", "/v1/completions", body=json.dumps(self.body), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            self.status, self.reply = r.status, r.read()
        except OSError as e:
            self.status, self.reply = None, str(e).encode()
        finally:
            c.close()


def open_stream(port, body):
    """A streaming completion: the response, after its first data line."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first = r.readline()
    while first and not first.startswith(b"data: "):
        first = r.readline()
    return c, r, first


def read_stream(r, first):
    """Every data line's JSON (or "[DONE]") up to the end."""
    events = []
    line = first
    while line:
        if line.startswith(b"data: "):
            d = line[6:].strip()
            events.append("[DONE]" if d == b"[DONE]" else json.loads(d))
        line = r.readline()
    return events


def wait_running(srv, n, timeout=60):
    """Wait until n requests are running or waiting in the engine."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = srv.metrics()
        if m.get("lamina_requests_running", 0) + m.get("lamina_requests_waiting", 0) >= n:
            return True
        time.sleep(0.02)
    return False


def refused(port, timeout=10):
    """True once a new connection is refused (the listening socket closed)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = socket.socket()
        try:
            s.settimeout(2)
            s.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
        except OSError:
            pass
        finally:
            s.close()
        time.sleep(0.02)
    return False


def wait_exit(srv, timeout):
    try:
        rc = srv.proc.wait(timeout)
    except Exception:
        srv.proc.kill()
        srv.proc.wait()
        return None, "\n".join(srv.lines)
    srv.reader.join(10)
    return rc, "\n".join(srv.lines)


def start(drain):
    return testenv.Server([LAMINA, "serve", "-m", MODEL, *ARGS, "--drain-timeout", str(drain)])


def graceful():
    srv = start(600)
    n_tok = 300 if ASAN else 1500
    body = {"prompt": "Once upon a time", "max_tokens": n_tok, "ignore_eos": True, "temperature": 0}
    c, r, first = open_stream(srv.port, body)
    w = Whole(srv.port, body)
    w.start()
    running = wait_running(srv, 2)
    srv.proc.send_signal(signal.SIGINT)
    t0 = time.time()
    result("graceful: both requests running at the signal", running)
    result("graceful: new connections refused", refused(srv.port))
    events = read_stream(r, first)
    c.close()
    w.join(600)
    rc, text = wait_exit(srv, 120)
    texts = [e for e in events if e != "[DONE]"]
    finish = [e["choices"][0].get("finish_reason") for e in texts if e.get("choices")]
    ok_stream = events and events[-1] == "[DONE]" and "length" in finish and not any("error" in e for e in texts)
    result("graceful: the stream finished whole", ok_stream, events[-3:])
    usage = json.loads(w.reply).get("usage", {}) if w.status == 200 else {}
    result("graceful: the whole request finished with every token", w.status == 200 and
           usage.get("completion_tokens") == n_tok, "%s %s" % (w.status, (w.reply or b"")[:300]))
    result("graceful: exit 0, and it said what it was finishing", rc == 0 and "finishing 2 requests" in text,
           "exit %s\n%s" % (rc, text[-2000:]))
    note("graceful stop took %.1f s" % (time.time() - t0))


def cancelled(name, drain, second):
    srv = start(drain)
    body = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True, "n": 8, "logprobs": 5}
    c, r, first = open_stream(srv.port, body)
    w = Whole(srv.port, body)
    w.start()
    running = wait_running(srv, 2)
    t0 = time.time()
    srv.proc.send_signal(signal.SIGTERM if not second else signal.SIGINT)
    if second:
        time.sleep(0.3)
        srv.proc.send_signal(signal.SIGINT)
    result("%s: both requests running at the signal" % name, running)
    events = read_stream(r, first)
    c.close()
    w.join(600)
    rc, text = wait_exit(srv, 120)
    took = time.time() - t0
    errs = [e for e in events if e != "[DONE]" and "error" in e]
    result("%s: the stream ends with an error event and [DONE]" % name,
           events and events[-1] == "[DONE]" and errs and "shutting down" in errs[-1]["error"]["message"],
           events[-3:])
    try:
        msg = json.loads(w.reply)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = None
    result("%s: the whole request gets 503 naming the shutdown" % name,
           w.status == 503 and msg and "shutting down" in msg, "%s %s" % (w.status, (w.reply or b"")[:300]))
    result("%s: exit 0 within seconds" % name, rc == 0 and took < 60, "exit %s after %.1f s\n%s" %
           (rc, took, text[-2000:]))
    note("%s: stopped in %.1f s" % (name, took))


class RouterProc:
    """`lamina route --spawn 1` on the bundled model, with the test's serve options."""

    def __init__(self, drain):
        import re
        import subprocess
        self.proc = subprocess.Popen([LAMINA, "route", "--spawn", "1", "-m", MODEL, "--port", "0", "--drain-timeout",
                                      str(drain), "--", *ARGS], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines, self.port = [], None
        got = threading.Event()

        def reader():
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.lines.append(line)
                m = re.search(r"lamina route: listening on http://127\.0\.0\.1:(\d+)", line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    got.set()
            got.set()

        self.reader = threading.Thread(target=reader, daemon=True)
        self.reader.start()
        got.wait(120)
        deadline = time.time() + 120
        while self.port and time.time() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    c.close()
                    return
                c.close()
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("router did not start: %s" % "\n".join(self.lines))


def route_graceful():
    """The router drains too: SIGINT with a stream and a whole request in flight through it."""
    rt = RouterProc(600)
    n_tok = 1500
    body = {"prompt": "Once upon a time", "max_tokens": n_tok, "ignore_eos": True, "temperature": 0}
    c, r, first = open_stream(rt.port, body)
    w = Whole(rt.port, body)
    w.start()
    deadline = time.time() + 60  # both taken by the router
    while time.time() < deadline:
        try:
            hc = http.client.HTTPConnection("127.0.0.1", rt.port, timeout=5)
            hc.request("GET", "/metrics")
            m = testenv.parse_metrics(hc.getresponse().read())
            hc.close()
            if m.get("lamina_router_requests_admitted_total", 0) >= 2:
                break
        except OSError:
            pass
        time.sleep(0.02)
    rt.proc.send_signal(signal.SIGINT)
    result("route graceful: new connections refused", refused(rt.port))
    events = read_stream(r, first)
    c.close()
    w.join(600)
    rc, text = wait_exit(rt, 120)
    texts = [e for e in events if e != "[DONE]"]
    finish = [e["choices"][0].get("finish_reason") for e in texts if e.get("choices")]
    result("route graceful: the stream finished whole", events and events[-1] == "[DONE]" and "length" in finish and
           not any("error" in e for e in texts), events[-3:])
    usage = json.loads(w.reply).get("usage", {}) if w.status == 200 else {}
    result("route graceful: the whole request finished with every token", w.status == 200 and
           usage.get("completion_tokens") == n_tok, "%s %s" % (w.status, (w.reply or b"")[:300]))
    result("route graceful: exit 0, and it said what it was finishing", rc == 0 and "finishing" in text,
           "exit %s\n%s" % (rc, text[-2000:]))


def main():
    for f in (graceful, lambda: cancelled("deadline", 0.5, False), lambda: cancelled("second signal", 600, True),
              route_graceful):
        try:
            f()
        except Exception as e:  # a failed phase is one failed check, the others still run
            result("phase ran", False, repr(e))
    return testenv.summary()


if __name__ == "__main__":
    sys.exit(main())
