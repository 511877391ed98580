#!/usr/bin/env python3
"""lamina pull, list, rm and -m with a hub name, without the internet: two
local HTTP servers play the hub (its listing and resolve endpoints, which
answer 302 to the second, a "CDN" on another port) and the CDN (Range
requests). Checked, each by its outcome:
  - a connection dropped halfway: exit 1, nothing under the final name, the
    partial file kept; the next pull sends "Range: bytes=N-" from the
    partial's size and the finished file is byte-identical, SHA-256 checked,
    no partial left; the path printed is CACHE/models/OWNER/REPO/FILE;
  - OWNER/REPO:TAG picks the file of that type from the listing (not the
    mmproj), and OWNER/REPO the default Q4_K_M;
  - a wrong published hash: exit 1 with the mismatch named, no final file,
    no partial;
  - a gated file: 401 without HF_TOKEN (exit 1, the message names HF_TOKEN),
    success with it; the hub sees the Bearer token, the CDN never does;
  - a server that stops sending: exit 1 with "timed out" within the
    timeout plus a margin (LAMINA_PULL_TIMEOUT=2), not a hang;
  - a server that ignores Range (200) and one that answers 416 to a
    partial as long as the file: the download starts over, the bytes right;
  - a 404, bad names ("..", no repository): exit 1 with a message;
  - --progress draws the "downloading" line;
  - list prints each cached file's name, exact size and type; rm removes
    one (and the folders it empties), refuses a name outside the cache and
    an unknown one;
  - no run reports anything from the sanitizers (an ASan build's exit 1
    could pass for an expected failure otherwise);
  - -m OWNER/REPO:TAG on `lamina info` uses the cached file without asking
    the hub; -m hf://... of a file not cached pulls it first;
  - the model as the first word: `logits OWNER/REPO:TAG`, `run hf://...`
    and `serve OWNER/REPO:TAG` as with -m (the same logits, text; the
    server names the cached file); the first word and -m both: exit 2;
  - a listing in pages (Link: <...>; rel="next", absolute then relative):
    every page followed, the model on the last found; a next page on
    another host refused;
  - a split model (the bundled model in three parts, tests/gguf_split.py):
    OWNER/REPO:TAG fetches every part (a part dropped halfway: exit 1, the
    first part not in place; the next pull completes the set, each part's
    bytes right); `lamina logits -m OWNER/REPO:TAG` prints what the unsplit
    file gives, the hub not asked; list shows the set once with the bytes
    of all parts; a later part's name gives the first part's path; rm
    removes every part.
"""
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testenv import Server as LaminaServer, result, summary  # noqa: E402
import gguf_split  # noqa: E402

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
MODEL = "models/stories260K.gguf"

with open(MODEL, "rb") as f:
    REAL = f.read()
RAND = os.urandom(700_000)
# repository -> file -> bytes
REPOS = {
    "acme/tiny-GGUF": {"tiny-Q8_0.gguf": REAL, "tiny-Q4_K_M.gguf": RAND, "mmproj-tiny-Q8_0.gguf": b"mm" * 1000,
                       "README.md": b"# tiny\n"},
    "acme/gated": {"g-Q8_0.gguf": RAND[:300_000]},
    "acme/badhash": {"b-Q8_0.gguf": RAND[:200_000]},
    "acme/slow": {"s-Q8_0.gguf": RAND[:400_000]},
}
_split_dir = tempfile.mkdtemp(prefix="lamina-e2e-split-")
SPLIT = {os.path.basename(p): open(p, "rb").read()
         for p in gguf_split.split(MODEL, os.path.join(_split_dir, "tiny-Q8_0"), 3)}
shutil.rmtree(_split_dir)
REPOS["acme/split-GGUF"] = dict(SPLIT, **{"README.md": b"# split\n"})
REPOS["acme/paged"] = {"README.md": b"r", "a.txt": b"a", "b.txt": b"b", "c.txt": b"c", "e.txt": b"e",
                       "p-Q8_0.gguf": REAL}
REPOS["acme/elsewhere"] = dict(REPOS["acme/paged"])
PAGED = {"acme/paged": "hub", "acme/elsewhere": "elsewhere"}
STATE = {"cursors": [], "drop_once": set(), "slow": set(), "norange": set(), "hub_auth": [], "cdn_auth": [], "ranges": [], "hub_hits": 0}
LOCK = threading.Lock()
CDN_PORT = [0]


class Quiet(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Hub(Quiet):
    def do_GET(self):
        with LOCK:
            STATE["hub_hits"] += 1
            STATE["hub_auth"].append(self.headers.get("Authorization"))
        p = self.path
        if p.startswith("/api/models/"):
            repo = p[len("/api/models/"):].split("/tree/")[0]
            if repo not in REPOS:
                return self.send(404, b'{"error":"Repository not found"}')
            items = [{"type": "file", "path": k, "size": len(v)} for k, v in REPOS[repo].items()]
            items.insert(0, {"type": "directory", "path": "sub"})
            headers = [("Content-Type", "application/json")]
            if repo in PAGED:  # pages of 3, as the hub pages its listings (Link: rel="next")
                cursor = int(p.split("cursor=")[1]) if "cursor=" in p else 0
                with LOCK:
                    STATE["cursors"].append(cursor)
                rest = items[cursor + 3:]
                items = items[cursor:cursor + 3]
                if rest:
                    nxt = "/api/models/%s/tree/main?recursive=true&cursor=%d" % (repo, cursor + 3)
                    if PAGED[repo] == "elsewhere":
                        nxt = "http://127.0.0.1:%d%s" % (CDN_PORT[0], nxt)
                    elif cursor == 0:  # the first link absolute, the next one relative
                        nxt = "http://%s%s" % (self.headers.get("Host"), nxt)
                    headers.append(("Link", '<%s>; rel="next", <https://example.invalid/x>; rel="last"' % nxt))
            return self.send(200, json.dumps(items).encode(), headers)
        if "/resolve/main/" not in p:
            return self.send(404)
        repo, fname = p[1:].split("/resolve/main/")
        if repo not in REPOS or fname not in REPOS[repo]:
            return self.send(404, b"Entry not found")
        if repo == "acme/gated" and self.headers.get("Authorization") != "Bearer secret":
            return self.send(401, b"Access to model acme/gated is restricted.")
        data = REPOS[repo][fname]
        sha = hashlib.sha256(data).hexdigest()
        if repo == "acme/badhash":
            sha = hashlib.sha256(data + b"x").hexdigest()
        loc = "http://127.0.0.1:%d/blob/%s/%s" % (CDN_PORT[0], repo.replace("/", "--"), fname)
        self.send(302, b"", [("Location", loc), ("X-Linked-Etag", '"%s"' % sha), ("ETag", '"%s"' % sha),
                             ("X-Linked-Size", str(len(data)))])


class Cdn(Quiet):
    def do_GET(self):
        _, _, key, fname = self.path.split("/", 3)
        repo = key.replace("--", "/")
        data = REPOS[repo][fname]
        with LOCK:
            STATE["cdn_auth"].append(self.headers.get("Authorization"))
            STATE["ranges"].append(self.headers.get("Range"))
        start = 0
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng.endswith("-") and fname not in STATE["norange"]:
            start = int(rng[6:-1])
        if start >= len(data) and len(data):
            return self.send(416)
        body = data[start:]
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"not-a-sha256"')
        self.end_headers()
        if fname in STATE["drop_once"]:
            STATE["drop_once"].discard(fname)
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if fname in STATE["slow"]:
            self.wfile.write(body[:10])
            self.wfile.flush()
            time.sleep(8)
            self.close_connection = True
            return
        self.wfile.write(body)


class Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client that gave up (the timeout check) resets its connection


def serve(cls):
    s = Server(("127.0.0.1", 0), cls)
    s.daemon_threads = True
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s


hub, cdn = serve(Hub), serve(Cdn)
CDN_PORT[0] = cdn.server_address[1]
tmp = tempfile.mkdtemp(prefix="lamina-e2e-pull-")
CACHE = os.path.join(tmp, "cache")
ENV = dict(os.environ, LAMINA_CACHE=CACHE, HF_ENDPOINT="http://127.0.0.1:%d/" % hub.server_address[1],
           LAMINA_PULL_TIMEOUT="20")
ENV.pop("HF_TOKEN", None)
MODELS = os.path.join(CACHE, "models")


def lamina(*args, env=None, timeout=60):
    t = time.time()
    p = subprocess.run([LAMINA] + list(args), env=env or ENV, capture_output=True, text=True, timeout=timeout)
    if "Sanitizer" in p.stderr or "runtime error:" in p.stderr:
        result("no sanitizer report: lamina %s" % " ".join(args), False, p.stderr)
    return p.returncode, p.stdout, p.stderr, time.time() - t


def exists(*parts):
    return os.path.exists(os.path.join(MODELS, *parts))


try:
    # 1. a connection dropped halfway, then a resume
    STATE["drop_once"].add("tiny-Q8_0.gguf")
    rc, out, err, _ = lamina("pull", "hf://acme/tiny-GGUF/tiny-Q8_0.gguf")
    part = os.path.join(MODELS, "acme", "tiny-GGUF", ".tiny-Q8_0.gguf.partial")
    psize = os.path.getsize(part) if os.path.exists(part) else -1
    result("dropped: exit 1, message says it resumes", rc == 1 and "resumes" in err, err)
    result("dropped: no final file, partial kept (half)", not exists("acme", "tiny-GGUF", "tiny-Q8_0.gguf")
           and 0 < psize < len(REAL), "partial %d of %d" % (psize, len(REAL)))
    STATE["ranges"].clear()
    rc, out, err, _ = lamina("pull", "hf://acme/tiny-GGUF/tiny-Q8_0.gguf")
    final = os.path.join(MODELS, "acme", "tiny-GGUF", "tiny-Q8_0.gguf")
    result("resume: exit 0, path printed", rc == 0 and out.strip() == final, out + err)
    result("resume: Range from the partial's size", STATE["ranges"] == ["bytes=%d-" % psize], str(STATE["ranges"]))
    result("resume: bytes identical, SHA-256 verified, no partial",
           os.path.exists(final) and open(final, "rb").read() == REAL and "SHA-256 verified" in err
           and not os.path.exists(part), err)

    # 2. a tag, the default
    rc, out, err, _ = lamina("pull", "acme/tiny-GGUF:q4_k_m", "--progress",
                             env=dict(ENV, LAMINA_PROGRESS_AFTER="0"))
    q4 = os.path.join(MODELS, "acme", "tiny-GGUF", "tiny-Q4_K_M.gguf")
    result("tag: Q4_K_M picked from the listing", rc == 0 and out.strip() == q4 and open(q4, "rb").read() == RAND,
           out + err)
    result("progress: the downloading line", "downloading" in err, err)
    rc, out, err, _ = lamina("pull", "acme/tiny-GGUF")
    result("default tag: Q4_K_M, already cached", rc == 0 and out.strip() == q4, out + err)
    rc, out, err, _ = lamina("pull", "acme/tiny-GGUF:Q6_K")
    result("tag absent: exit 1, named", rc == 1 and "Q6_K" in err, err)

    # 3. a wrong hash
    rc, out, err, _ = lamina("pull", "acme/badhash:Q8_0")
    d = os.path.join(MODELS, "acme", "badhash")
    left = os.listdir(d) if os.path.isdir(d) else []
    result("wrong hash: exit 1, mismatch named", rc == 1 and "SHA-256 mismatch" in err, err)
    result("wrong hash: nothing left (no final file, no partial)", left == [], str(left))

    # 4. gated
    STATE["cdn_auth"].clear()
    rc, out, err, _ = lamina("pull", "hf://acme/gated/g-Q8_0.gguf")
    result("gated without HF_TOKEN: 401, HF_TOKEN named", rc == 1 and "401" in err and "HF_TOKEN" in err, err)
    STATE["hub_auth"].clear()
    rc, out, err, _ = lamina("pull", "hf://acme/gated/g-Q8_0.gguf", env=dict(ENV, HF_TOKEN="secret"))
    result("gated with HF_TOKEN: exit 0, bytes identical",
           rc == 0 and open(out.strip(), "rb").read() == REPOS["acme/gated"]["g-Q8_0.gguf"], out + err)
    result("token sent to the hub, never to the CDN", "Bearer secret" in STATE["hub_auth"]
           and STATE["cdn_auth"] and all(a is None for a in STATE["cdn_auth"]),
           "hub %s cdn %s" % (STATE["hub_auth"], STATE["cdn_auth"]))

    # 5. a slow server
    STATE["slow"].add("s-Q8_0.gguf")
    rc, out, err, dt = lamina("pull", "acme/slow:Q8_0", env=dict(ENV, LAMINA_PULL_TIMEOUT="2"))
    result("slow: exit 1 with 'timed out' within 2 s + margin", rc == 1 and "timed out" in err and dt < 7,
           "%.1f s: %s" % (dt, err))
    STATE["slow"].clear()
    rc, out, err, _ = lamina("pull", "acme/slow:Q8_0")
    result("slow: the next pull resumes and completes", rc == 0 and "resuming at byte 10" in err
           and open(out.strip(), "rb").read() == REPOS["acme/slow"]["s-Q8_0.gguf"], out + err)

    # a server that ignores the range: the whole file again, the partial emptied first
    d = os.path.join(MODELS, "acme", "gated")
    gpart = os.path.join(d, ".g-Q8_0.gguf.partial")
    gdata = REPOS["acme/gated"]["g-Q8_0.gguf"]
    os.remove(os.path.join(d, "g-Q8_0.gguf"))
    open(gpart, "wb").write(b"garbage!" * 100)
    STATE["norange"].add("g-Q8_0.gguf")
    rc, out, err, _ = lamina("pull", "hf://acme/gated/g-Q8_0.gguf", env=dict(ENV, HF_TOKEN="secret"))
    STATE["norange"].clear()
    result("range ignored (200): started over, bytes identical", rc == 0 and open(out.strip(), "rb").read() == gdata
           and not os.path.exists(gpart), out + err)
    # a partial as long as the file: 416, then a fresh download
    os.remove(os.path.join(d, "g-Q8_0.gguf"))
    open(gpart, "wb").write(b"\0" * len(gdata))
    STATE["ranges"].clear()
    rc, out, err, _ = lamina("pull", "hf://acme/gated/g-Q8_0.gguf", env=dict(ENV, HF_TOKEN="secret"))
    result("416 on a full-length partial: started over, bytes identical",
           rc == 0 and open(out.strip(), "rb").read() == gdata and STATE["ranges"] == ["bytes=%d-" % len(gdata), None],
           "%s %s" % (STATE["ranges"], out + err))

    # 6. 404, bad names
    rc, out, err, _ = lamina("pull", "hf://acme/tiny-GGUF/missing.gguf")
    result("404: exit 1, named", rc == 1 and "404" in err, err)
    rc, out, err, _ = lamina("pull", "acme/nope:Q8_0")
    result("unknown repository: exit 1, 404", rc == 1 and "404" in err, err)
    for bad in ["acme/../etc/x.gguf", "hf://acme", "acme/r/x.bin", "acme/r:Q4 K", ""]:
        rc, out, err, _ = lamina("pull", bad)
        result("bad name %r: refused with a message" % bad, rc in (1, 2) and "lamina pull" in err and not out, err)

    # 7. list and -m
    rc, out, err, _ = lamina("list")
    rows = {ln.split("\t")[0]: ln.split("\t")[1:] for ln in out.splitlines()}
    result("list: every cached file, exact sizes", rc == 0 and rows.get("acme/tiny-GGUF/tiny-Q8_0.gguf", [""])[0]
           == str(len(REAL)) and rows.get("acme/tiny-GGUF/tiny-Q4_K_M.gguf", [""])[0] == str(len(RAND))
           and "acme/gated/g-Q8_0.gguf" in rows and len(rows) == 4, out + err)
    info = subprocess.run([LAMINA, "info", MODEL], capture_output=True, text=True).stdout
    t = rows.get("acme/tiny-GGUF/tiny-Q8_0.gguf", ["", ""])[1]
    result("list: the type of the real model, '?' for the unreadable",
           t not in ("", "?") and t in info and rows.get("acme/tiny-GGUF/tiny-Q4_K_M.gguf", ["", ""])[1] == "?",
           "%s / %s" % (out, info))
    hits = STATE["hub_hits"]
    rc, out, err, _ = lamina("info", "-m", "acme/tiny-GGUF:Q8_0")
    result("-m OWNER/REPO:TAG: the cached file, the hub not asked",
           rc == 0 and "architecture" in out and STATE["hub_hits"] == hits, out + err)

    # 8. rm
    rc, out, err, _ = lamina("rm", "acme/tiny-GGUF/tiny-Q8_0.gguf")
    result("rm: removed", rc == 0 and not os.path.exists(final) and os.path.exists(q4), err)
    rc, out, err, _ = lamina("info", "-m", "hf://acme/tiny-GGUF/tiny-Q8_0.gguf")
    result("-m hf://... not cached: pulled, then used", rc == 0 and "architecture" in out and os.path.exists(final),
           out + err)
    rc, out, err, _ = lamina("rm", "acme/gated:Q8_0")
    result("rm by tag: removed, empty folder too", rc == 0 and not os.path.exists(os.path.join(MODELS, "acme", "gated")),
           err)
    outside = os.path.join(tmp, "keep.gguf")
    open(outside, "wb").write(b"x")
    for bad in ["../keep.gguf", "acme/../../keep.gguf", outside]:
        rc, out, err, _ = lamina("rm", bad)
        result("rm %r refused" % bad, rc == 1 and os.path.exists(outside), err)
    rc, out, err, _ = lamina("rm", "acme/none:Q8_0")
    result("rm unknown: exit 1, named", rc == 1 and "no such model" in err, err)

    # the model as the first word after the command
    prompt = ["-p", "Once upon a time", "--top", "8"]
    rc, out, err, _ = lamina("logits", "acme/tiny-GGUF:Q8_0", *prompt)
    want = subprocess.run([LAMINA, "logits", "-m", MODEL] + prompt, capture_output=True, text=True).stdout
    result("first word: logits OWNER/REPO:TAG as -m", rc == 0 and "top:" in out and out == want, out + want + err)
    gen = ["-p", "Once upon a time", "-n", "12", "--temp", "0"]
    rc, out, err, _ = lamina("run", "hf://acme/tiny-GGUF/tiny-Q8_0.gguf", *gen)
    want = subprocess.run([LAMINA, "run", "-m", MODEL] + gen, capture_output=True, text=True).stdout
    result("first word: run hf://... as -m", rc == 0 and len(out) > 20 and out == want, out + want + err)
    rc, out, err, _ = lamina("run", MODEL, "-m", MODEL, "-p", "x")
    result("first word and -m: usage error, named", rc == 2 and "named twice" in err, err)
    saved = dict(os.environ)
    os.environ.update(ENV)
    try:
        srv = LaminaServer([LAMINA, "serve", "acme/tiny-GGUF:Q8_0"])
        code, body = srv.get("/v1/models")
        result("first word: serve OWNER/REPO:TAG serves the cached file",
               code == 200 and b"tiny-Q8_0.gguf" in body, body)
        srv.stop("serve OWNER/REPO:TAG")
    except RuntimeError as e:
        result("first word: serve OWNER/REPO:TAG starts", False, str(e))
    finally:
        os.environ.clear()
        os.environ.update(saved)

    # 9. a paged listing: three pages, the model on the last
    STATE["cursors"].clear()
    rc, out, err, _ = lamina("pull", "acme/paged:Q8_0")
    result("paged listing: every page followed, the model on the last one found",
           rc == 0 and out.strip() == os.path.join(MODELS, "acme", "paged", "p-Q8_0.gguf")
           and STATE["cursors"] == [0, 3, 6], "%s %s" % (STATE["cursors"], out + err))
    STATE["cursors"].clear()
    rc, out, err, _ = lamina("pull", "acme/elsewhere:Q8_0")
    result("paged listing: a next page on another host refused", rc == 1 and "not on the hub" in err
           and STATE["cursors"] == [0], "%s %s" % (STATE["cursors"], err))

    # 10. a split model
    parts = sorted(SPLIT)
    STATE["drop_once"].add(parts[1])
    rc, out, err, _ = lamina("pull", "acme/split-GGUF:Q8_0")
    sdir = os.path.join(MODELS, "acme", "split-GGUF")
    result("split: a part dropped: exit 1, the first part not in place",
           rc == 1 and "resumes" in err and not os.path.exists(os.path.join(sdir, parts[0])), err)
    rc, out, err, _ = lamina("pull", "acme/split-GGUF:Q8_0")
    result("split: the next pull completes the set, the first part's path printed",
           rc == 0 and out.strip() == os.path.join(sdir, parts[0])
           and all(open(os.path.join(sdir, f), "rb").read() == SPLIT[f] for f in parts)
           and err.count("SHA-256 verified") >= 2, out + err)
    hits = STATE["hub_hits"]
    prompt = ["-p", "Once upon a time", "--top", "8"]
    rc, out, err, _ = lamina("logits", "-m", "acme/split-GGUF:Q8_0", *prompt)
    want = subprocess.run([LAMINA, "logits", "-m", MODEL] + prompt, capture_output=True, text=True).stdout
    result("split: logits of -m OWNER/REPO:TAG equal the unsplit file's, the hub not asked",
           rc == 0 and "top:" in out and out == want and STATE["hub_hits"] == hits, "%s\n%s\n%s" % (out, want, err))
    rc, out, err, _ = lamina("list")
    srows = [ln.split("\t") for ln in out.splitlines() if ln.startswith("acme/split-GGUF/")]
    result("split: list shows the set once, the bytes of all parts",
           rc == 0 and len(srows) == 1 and srows[0][0] == "acme/split-GGUF/" + parts[0]
           and srows[0][1] == str(sum(len(v) for v in SPLIT.values())) and srows[0][2] not in ("", "?"), out + err)
    rc, out, err, _ = lamina("pull", "hf://acme/split-GGUF/" + parts[2])
    result("split: a later part's name gives the first part's path", rc == 0
           and out.strip() == os.path.join(sdir, parts[0]) and STATE["hub_hits"] == hits, out + err)
    rc, out, err, _ = lamina("rm", "acme/split-GGUF:Q8_0")
    result("split: rm removes every part", rc == 0 and not os.path.exists(sdir), err)
finally:
    hub.shutdown()
    cdn.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
summary()
