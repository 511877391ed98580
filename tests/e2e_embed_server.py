#!/usr/bin/env python3
"""POST /v1/embeddings on `lamina serve` and through `lamina route`.

The reference is llama.cpp's llama-embedding on the same bytes, as
tests/data/embed/ records it (e2e_embed.py checks `lamina embed` against the
same facts; README.md there says how they were made): the three lines of
inputs.txt, L2-normalized, and their token count.

  1. The bundled chat model with --pooling mean, through the official
     `openai` client (installed into a venv under $LAMINA_CACHE, as
     e2e_server.py does; its checks are skipped when it cannot be had): the
     client's default request (base64, decoded by the client) against
     llama.cpp's vectors (cosine >= COS_MIN, norm 1, usage = llama.cpp's
     token count); encoding_format float the same floats exactly;
     encoding_format base64 decoded as little-endian float32 the same floats;
     dimensions 8: the first 8 values of the raw vector ("normalize": false)
     normalized (1e-6); token-id input (the ids `lamina tokenize` gives)
     the same vector as the text; 40 inputs in one request each equal to
     that input sent alone (1e-6).
  2. Raw HTTP: bad bodies get 400 naming the parameter (an empty string, an
     empty list, mixed types, an id out of range, dimensions above the
     width, a bad encoding_format); /v1/models lists "embeddings" with the
     width and the pooling.
  3. The same model without --pooling: a 400 that says it is a generative
     model and names --pooling (through the client too); /v1/models lists no
     "embeddings".
  4. Through the router: beside the real replica, a stand-in replica that
     answers every POST with 500; with round-robin every embeddings request
     still succeeds (retried on the real one) with the vectors the replica
     gives directly, and the stand-in was tried.
  5. An engine that lets 2 requests wait (--max-waiting 2): 300 inputs in
     one request are all answered (each waits for room), the same vector as
     alone; a client that goes away mid-request leaves the engine idle with
     no KV block held.
  6. qwen3-embedding-small (`lamina mkmodel --preset`, F16, written into a
     temporary folder; the file's sha256 as recorded): served without
     --pooling (its own: last token, EOS appended), the vectors against
     llama.cpp's (cosine >= COS_MIN) and its token count.
COS_MIN is 0.9999, as in e2e_embed.py (llama.cpp prints 7 decimals).
"""
import base64
import hashlib
import http.client
import json
import os
import shlex
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testenv  # noqa: E402 (tests/ is the script's folder)
from testenv import cos, result, skip, summary  # noqa: E402
import e2e_server as es  # noqa: E402 (the openai venv)

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "embed")
INPUTS = [line.rstrip("\n") for line in open(os.path.join(DATA, "inputs.txt"), encoding="utf-8") if line.strip()]
LAMINA = shlex.split(os.environ.get("LAMINA_BIN", "build/lamina"))
MODEL = "models/stories260K.gguf"
COS_MIN = 0.9999
N_CLIENT_CHECKS = 10


def facts(name):
    return [d["embedding"] for d in json.load(open(os.path.join(DATA, name), encoding="utf-8"))["data"]]


def n_tokens(key):
    for line in open(os.path.join(DATA, "n_tokens.txt"), encoding="utf-8"):
        k, v = line.split()
        if k == key:
            return int(v)
    return -1


def post(port, path, body, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        c.close()


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


class Server(testenv.Server):
    def __init__(self, model, *args):
        super().__init__([*LAMINA, "serve", "-m", model, "-t", "1", *args])


CLIENT_SCRIPT = r'''
import base64, json, math, struct, sys
import openai
cfg = json.loads(sys.argv[1])
client = openai.OpenAI(base_url=cfg["base"], api_key="unused", max_retries=0, timeout=120)
M, INPUTS, WANT = cfg["model"], cfg["inputs"], cfg["facts"]

def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name)
    if not ok:
        print("  " + str(detail)[:2000])
    sys.stdout.flush()

def cos(u, v):
    return sum(a * b for a, b in zip(u, v)) / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))

def norm(u):
    return math.sqrt(sum(a * a for a in u))

def run(name, fn):
    try:
        fn()
    except Exception as e:
        check(name, False, "%s: %s" % (type(e).__name__, e))

state = {}

def default():
    r = client.embeddings.create(model=M, input=INPUTS)  # the client asks for base64 and decodes it
    vecs = [d.embedding for d in r.data]
    state["vecs"] = vecs
    cs = [cos(u, v) for u, v in zip(vecs, WANT)]
    check("client default vs llama.cpp", len(vecs) == len(WANT) and min(cs) >= cfg["cos_min"], cs)
    check("client default norm 1", all(abs(norm(u) - 1) < 1e-5 for u in vecs), [norm(u) for u in vecs])
    check("client usage", r.usage.prompt_tokens == cfg["n_tokens"] and r.usage.total_tokens == cfg["n_tokens"],
          r.usage)
    check("client shape", r.object == "list" and r.model == M and [d.index for d in r.data] == [0, 1, 2]
          and all(d.object == "embedding" for d in r.data), r)

def floats():
    r = client.embeddings.create(model=M, input=INPUTS, encoding_format="float")
    f32 = [[struct.unpack("<f", struct.pack("<f", x))[0] for x in d.embedding] for d in r.data]
    check("client float equals default", f32 == state["vecs"], "")

def b64():
    r = client.embeddings.create(model=M, input=INPUTS, encoding_format="base64")
    dec = []
    for d in r.data:
        raw = base64.b64decode(d.embedding)
        dec.append(list(struct.unpack("<%df" % (len(raw) // 4), raw)))
    check("client base64 little-endian float32", dec == state["vecs"], [len(x) for x in dec])

def dims():
    r = client.embeddings.create(model=M, input=INPUTS[0], dimensions=8)
    raw = client.embeddings.create(model=M, input=INPUTS[0], encoding_format="float",
                                   extra_body={"normalize": False}).data[0].embedding
    v = r.data[0].embedding
    n8 = norm(raw[:8])
    ok = len(v) == 8 and abs(norm(raw) - 1) > 1e-3 and all(abs(a - b / n8) < 1e-6 for a, b in zip(v, raw[:8]))
    check("client dimensions 8 = raw truncated, normalized", ok, (v, raw[:8]))

def ids():
    r = client.embeddings.create(model=M, input=cfg["ids"], encoding_format="float")
    v = r.data[0].embedding
    check("client token ids = text", r.usage.prompt_tokens == len(cfg["ids"]) and
          all(abs(a - b) < 1e-6 for a, b in zip(v, state["vecs"][0])) and len(v) == len(state["vecs"][0]), v[:4])

def batch():
    texts = ["story %d: once upon a time a %s" % (i, "cat" if i % 2 else "dog") for i in range(40)]
    r = client.embeddings.create(model=M, input=texts, encoding_format="float")
    alone = [client.embeddings.create(model=M, input=t, encoding_format="float").data[0].embedding
             for t in texts[:6]]
    ok = len(r.data) == 40 and all(d.index == i for i, d in enumerate(r.data))
    worst = max(abs(a - b) for u, v in zip(r.data, alone) for a, b in zip(u.embedding, v))
    check("client 40 inputs batched = alone", ok and worst < 1e-6, worst)

def chat_model_refused():
    if not cfg.get("refusing"):
        check("client chat model refused", True)
        return
    c2 = openai.OpenAI(base_url=cfg["refusing"], api_key="unused", max_retries=0, timeout=60)
    try:
        c2.embeddings.create(model=M, input="hello")
        check("client chat model refused", False, "no error")
    except openai.BadRequestError as e:
        check("client chat model refused", e.status_code == 400 and "--pooling" in str(e) and
              "generative" in str(e), e)

for name, fn in [("default", default), ("float", floats), ("base64", b64), ("dimensions", dims), ("ids", ids),
                 ("batch", batch), ("refused", chat_model_refused)]:
    run("client " + name, fn)
'''


def client_checks(port, refusing_port, ids):
    py, why = es.openai_python()
    if not py:
        skip("openai client checks", why, N_CLIENT_CHECKS)
        return
    cfg = {"base": "http://127.0.0.1:%d/v1" % port, "model": "stories260K.gguf", "inputs": INPUTS,
           "facts": facts("stories260K-mean.json"), "n_tokens": n_tokens("stories260K-mean"), "cos_min": COS_MIN,
           "ids": ids, "refusing": "http://127.0.0.1:%d/v1" % refusing_port}
    r = subprocess.run([py, "-c", CLIENT_SCRIPT, json.dumps(cfg)], capture_output=True, text=True, timeout=300)
    n = 0
    for line in r.stdout.splitlines():
        if line.startswith("PASS ") or line.startswith("FAIL "):
            n += 1
            result(line[5:], line.startswith("PASS "))
        elif line.startswith("  "):
            print(line)
    if n != N_CLIENT_CHECKS or r.returncode != 0:
        result("openai client script ran every check", False, "%d checks, exit %d\n%s" % (n, r.returncode,
                                                                                          r.stderr[-3000:]))


def bad_bodies(port):
    cases = [({"input": ""}, "input"), ({"input": []}, "input"), ({"input": ["a", 3]}, "input"),
             ({"input": [[1], []]}, "input[1]"), ({"input": [512]}, "input"),
             ({"input": "a", "dimensions": 65}, "dimensions"), ({"input": "a", "encoding_format": "hex"},
                                                                "encoding_format")]
    bad = []
    for body, param in cases:
        st, o = post(port, "/v1/embeddings", body)
        if st != 400 or not isinstance(o, dict) or o.get("error", {}).get("param") != param:
            bad.append((body, st, o))
    result("bad bodies: 400 naming the parameter", not bad, bad)


def answer_500(h):
    """A replica's POST answered 500 (testenv.FakeReplica)."""
    body = b'{"error":{"message":"broken","type":"server_error","param":null,"code":null}}'
    h.send_response(500)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def through_router(real_port):
    fake = testenv.FakeReplica(answer_500)
    cmd = [*LAMINA, "route", "--policy", "rr", "--replica", "http://127.0.0.1:%d" % fake.port,
           "--replica", "http://127.0.0.1:%d" % real_port]
    router = testenv.Server.__new__(testenv.Server)
    try:
        testenv.Server.__init__(router, cmd)
    except RuntimeError as e:
        result("router starts", False, e)
        fake.close()
        return
    bodies = [{"input": INPUTS}, {"input": INPUTS[1], "dimensions": 16}, {"input": [[1, 5, 9], [1, 7]]},
              {"input": INPUTS[2], "encoding_format": "base64"}]
    bad = []
    for b in bodies:
        st, via = post(router.port, "/v1/embeddings", b)
        st2, direct = post(real_port, "/v1/embeddings", b)
        if st != 200 or st2 != 200 or via["data"] != direct["data"] or via["usage"] != direct["usage"]:
            bad.append((b, st, st2))
    result("router: embeddings answered as the replica answers them", not bad, bad)
    result("router: the failing replica was tried and its requests retried", fake.posts >= 1, fake.posts)
    st, o = post(router.port, "/v1/embeddings", {"input": ""})
    result("router: a bad body's 400 passes through", st == 400 and o["error"]["param"] == "input", (st, o))
    router.stop("router")
    fake.close()


def qwen3_embedding(tmp):
    model = os.path.join(tmp, "qwen3-embedding-small-F16.gguf")
    p = subprocess.run([*LAMINA, "mkmodel", "--preset", "qwen3-embedding-small", "--type", "F16", "--vocab-from",
                        os.path.join(HERE, "data", "vocab", "ggml-vocab-gpt-2.gguf"), "-o", model],
                       capture_output=True, timeout=300)
    sha = hashlib.sha256(open(model, "rb").read()).hexdigest() if p.returncode == 0 else p.stderr.decode()
    want_sha = open(os.path.join(DATA, "qwen3-embedding-small-F16.sha256"), encoding="utf-8").read().strip()
    if not result("qwen3-embedding-small: the recorded file", sha == want_sha, sha):
        return
    srv = Server(model)
    st, o = post(srv.port, "/v1/embeddings", {"input": INPUTS, "encoding_format": "base64"})
    vecs = []
    if st == 200:
        for d in o["data"]:
            raw = base64.b64decode(d["embedding"])
            vecs.append(struct.unpack("<%df" % (len(raw) // 4), raw))
    want = facts("qwen3-embedding-small-F16.json")
    cs = [cos(u, v) for u, v in zip(vecs, want)]
    result("qwen3-embedding-small: vs llama.cpp (its own pooling, EOS)",
           st == 200 and len(cs) == len(want) and min(cs) >= COS_MIN, (st, cs))
    result("qwen3-embedding-small: token count", st == 200 and
           o["usage"]["prompt_tokens"] == n_tokens("qwen3-embedding-small-F16"), o.get("usage") if st == 200 else o)
    st, m = get(srv.port, "/v1/models")
    d = m["data"][0]
    result("qwen3-embedding-small: /v1/models", "embeddings" in d.get("capabilities", []) and
           d.get("pooling") == "last", d)
    srv.stop("qwen3-embedding-small server")


def busy_engine():
    """An engine that lets 2 requests wait: 300 inputs in one request still all go through (each input
    waits for room), and a client gone mid-request leaves the engine idle with no KV block held."""
    srv = Server(MODEL, "--pooling", "mean", "--max-waiting", "2", "--max-seqs", "4")
    texts = ["input %d of many: the cat sat on the mat" % i for i in range(300)]
    st, o = post(srv.port, "/v1/embeddings", {"input": texts, "encoding_format": "base64"})
    st1, one = post(srv.port, "/v1/embeddings", {"input": texts[123], "encoding_format": "base64"})
    rejected = es.metrics(srv).get("lamina_requests_rejected_total", 0)
    result("max-waiting 2: 300 inputs in one request all answered", st == 200 and len(o["data"]) == 300 and
           st1 == 200 and o["data"][123]["embedding"] == one["data"][0]["embedding"], (st, st1))
    result("max-waiting 2: the engine was full (submissions refused as busy, then retried)", rejected > 0, rejected)
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    body = json.dumps({"input": [t * 3 for t in texts] * 6})
    c.request("POST", "/v1/embeddings", body=body, headers={"Content-Type": "application/json"})
    c.sock.close()  # gone before the answer
    ok, m = es.wait_idle(srv, 30)
    result("client gone: the engine idle, no KV block held", ok, m)
    srv.stop("server --max-waiting 2")


def main():
    ids = [int(x) for x in subprocess.run([*LAMINA, "tokenize", "-m", MODEL, "--ids", "--bos"],
                                          input=INPUTS[0].encode(), capture_output=True, timeout=60).stdout.split()]
    srv = Server(MODEL, "--pooling", "mean")
    plain = Server(MODEL)
    client_checks(srv.port, plain.port, ids)
    bad_bodies(srv.port)
    st, m = get(srv.port, "/v1/models")
    d = m["data"][0]
    result("/v1/models: embeddings, width, pooling", "embeddings" in d.get("capabilities", []) and
           d.get("embedding_dim") == 64 and d.get("pooling") == "mean", d)
    st, o = post(plain.port, "/v1/embeddings", {"input": "hello"})
    result("chat model without --pooling: 400 saying why", st == 400 and "generative model" in
           o["error"]["message"] and "--pooling" in o["error"]["message"], o)
    st, m = get(plain.port, "/v1/models")
    result("chat model without --pooling: /v1/models lists no embeddings",
           "embeddings" not in m["data"][0].get("capabilities", []), m)
    plain.stop("server without --pooling")
    through_router(srv.port)
    srv.stop("server --pooling mean")
    busy_engine()
    with tempfile.TemporaryDirectory() as tmp:
        qwen3_embedding(tmp)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
