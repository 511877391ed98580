"""Helpers the serving benchmarks share: requests to a server, a streamed completion's token times,
percentiles, argument types, and the output guard of their JSON files.

Standard library only.
"""
import argparse
import http.client
import json
import os
import tempfile
import time


def pct(v, p):
    """The p-quantile of v by nearest rank (p99 of 16 TTFTs is the largest)."""
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p * (len(v) - 1))))] if v else float("nan")


def http_json(port, method, path, body=None, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, None if body is None else json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError("%s %s: HTTP %d: %s" % (method, path, r.status, data[:300]))
        return json.loads(data)
    finally:
        c.close()


def wait_health(port, proc, name, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("%s exited with status %s before it was ready" % (name, proc.returncode))
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            ok = c.getresponse().status == 200
            c.close()
            if ok:
                return
        except OSError:
            pass
        time.sleep(0.25)
    raise RuntimeError("%s on port %d was not ready after %d s" % (name, port, timeout))


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def stream_one(port, prompt, max_tokens, model, stop=None):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "seed": 1}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.monotonic()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:300]))
    times, usage, finish, buf, done = [], None, None, b"", False
    while not done and not (stop and stop.is_set()):
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            ev = ev.strip(b"\r\n")
            if not ev.startswith(b"data: "):
                continue  # a keep-alive comment
            data = ev[6:]
            if data == b"[DONE]":
                done = True
                break
            obj = json.loads(data)
            now = time.monotonic()
            if obj.get("usage"):
                usage = obj["usage"]
            for ch in obj.get("choices") or []:
                if ch.get("text"):
                    times.append(now)
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
    t1 = time.monotonic()
    c.close()
    if not usage and not (stop and stop.is_set()):
        raise RuntimeError("the stream ended without usage")
    usage = usage or {}
    return {"t0": t0, "t1": t1, "times": times, "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"), "finish_reason": finish}


def check_out_path(path, inputs, force, who):
    """Refuse an --out that is an input, a link, a folder, a device, or (without --force) any existing file."""
    if os.path.islink(path):
        raise SystemExit(who + ": --out %s is a symbolic link; give a plain new path" % path)
    if os.path.isdir(path):
        raise SystemExit(who + ": --out %s is a folder; give a file path" % path)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise SystemExit(who + ": --out %s: its folder %s does not exist" % (path, parent))
    if os.path.exists(path) and not os.path.isfile(path):
        raise SystemExit(who + ": --out %s is a device or another special file; give a file path" % path)
    if os.path.exists(path):
        for name, p in inputs:
            if os.path.exists(p) and os.path.samefile(path, p):
                raise SystemExit(who + ": --out %s is the %s, an input; refusing to overwrite it" % (path, name))
        if not force:
            raise SystemExit(who + ": --out %s exists; remove it or pass --force" % path)


def write_json(path, obj, who):
    """Written beside path, synced, then renamed over it: never through an existing file or link."""
    fd, tmp = tempfile.mkstemp(prefix="." + who + "-", suffix=".json", dir=os.path.dirname(os.path.abspath(path)))
    try:
        os.chmod(tmp, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        os.unlink(tmp)
        raise


def positive(lo):
    def parse(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a whole number" % s)
        if v < lo:
            raise argparse.ArgumentTypeError("%d is below the least allowed, %d" % (v, lo))
        return v
    return parse


def executable(s):
    if not (os.path.isfile(s) and os.access(s, os.X_OK)):
        raise argparse.ArgumentTypeError("%s is not an executable file" % s)
    return s


def readable(s):
    if not (os.path.isfile(s) and os.access(s, os.R_OK)):
        raise argparse.ArgumentTypeError("%s is not a readable file" % s)
    return s
