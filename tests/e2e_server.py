#!/usr/bin/env python3
"""End-to-end checks of `lamina serve` on the bundled model (models/stories260K.gguf).

The script starts the servers it needs itself ($LAMINA_BIN serve ... --port 0,
reading the port from the "listening on" line), waits for /health, and always
stops them with SIGTERM at the end: each must exit with status 0 and print
nothing from AddressSanitizer / UBSan.

  1. The official `openai` Python client (installed from PyPI into a venv under
     $LAMINA_CACHE, default ~/.cache/lamina/venv-openai; when that fails these
     checks count as skipped, never as passed): completions, chat (ChatML
     template given with --chat-template), streaming, n=2, stop strings,
     usage counts against `lamina tokenize`, logprobs, streamed text equal to
     the non-streamed text for the same seed.
  2. Errors over plain HTTP: malformed JSON, wrong types, missing fields,
     unknown model, invalid UTF-8, out-of-range parameters, bodies over the
     limit (413, declared and chunked), prompt + max_tokens past the context,
     API keys (401; /health and /metrics open), unknown routes (404), wrong
     methods (405), a full queue (429 with Retry-After), an error the engine
     finds while generating (a logit_bias banning every token: 400, and the
     error object as a stream's last event). Each checks the status and the
     shape of OpenAI's error object.
     A server with one sequence slot, a 1 s request timeout and a 1 s idle
     timeout: a long request is cut with what it has (and still answered,
     finish_reason "abort"), a stream queued behind it gets keep-alive
     comments, n above the engine's sequences is a 400 naming n; a client that stops
     reading a stream (without closing) has its request cancelled.
  3. Client disconnect: a long stream closed after a few chunks is cancelled
     (far fewer tokens generated than asked) and its KV blocks return.
  4. Load: 64 concurrent streaming clients, 256 requests (16 and 64 under
     ASan): all complete, batches of more than one sequence, no block held.
  5. Fuzz: a few thousand random and mutated requests over raw sockets; the
     server must keep answering /health.
"""
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
MODEL = "models/stories260K.gguf"
MODEL_NAME = "stories260K.gguf"
ASAN = bool(os.environ.get("LAMINA_ASAN"))
import testenv  # noqa: E402 (tests/ is the script's folder)
from testenv import CACHE, install_out, result, skip, summary  # noqa: E402
CTX = 1024
N_CLIENT_CHECKS = 10  # checks the openai-client part makes (counted as skipped when it cannot run)

lock = threading.Lock()  # for the counts the load checks' threads share


# ---------------------------------------------------------------- servers

class Server(testenv.Server):
    def __init__(self, *args):
        super().__init__([LAMINA, "serve", "-m", MODEL, "-t", "1", *args])


def conn(srv, timeout=60):
    return http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)


def request(srv, method, path, body=None, headers=None, timeout=60):
    c = conn(srv, timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def get(srv, path, headers=None):
    return request(srv, "GET", path, headers=headers)


def post(srv, path, body, headers=None, timeout=60):
    return request(srv, "POST", path, body, headers, timeout)


def metrics(srv):
    """/metrics of a server or a router."""
    return testenv.parse_metrics(get(srv, "/metrics")[2])


def wait_idle(srv, timeout=30):
    """Poll /metrics until nothing runs and no KV block is held."""
    deadline = time.time() + timeout
    m = {}
    while time.time() < deadline:
        m = metrics(srv)
        if m.get("lamina_requests_running") == 0 and m.get("lamina_requests_waiting") == 0 and \
                m.get("lamina_kv_blocks_used") == 0:
            return True, m
        time.sleep(0.05)
    return False, m


def tokenize_count(text):
    r = subprocess.run([LAMINA, "tokenize", "-m", MODEL, "--ids", "--bos"], input=text.encode(), capture_output=True,
                       timeout=120)
    return len(r.stdout.split())


# --------------------------------------------------------- 1. openai client

CLIENT_SCRIPT = r'''
import json, sys
import openai
cfg = json.loads(sys.argv[1])
client = openai.OpenAI(base_url=cfg["base"], api_key="unused", max_retries=0, timeout=120)
M = cfg["model"]

def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name)
    if not ok:
        print("  " + str(detail))
    sys.stdout.flush()

def run(name, fn):
    try:
        fn()
    except Exception as e:
        check(name, False, "%s: %s" % (type(e).__name__, e))

def completions():
    r = client.completions.create(model=M, prompt="Once upon a time", max_tokens=16, temperature=0)
    c = r.choices[0]
    check("client completions", r.object == "text_completion" and r.id.startswith("cmpl-") and len(r.choices) == 1
          and isinstance(c.text, str) and c.text and c.finish_reason in ("stop", "length") and r.model == M
          and r.usage.prompt_tokens == cfg["prompt_tokens"]
          and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens,
          "%r, prompt tokens %s, want %s" % (r, r.usage.prompt_tokens, cfg["prompt_tokens"]))

def usage():
    r = client.completions.create(model=M, prompt="Once upon a time", max_tokens=23, temperature=0.9, seed=3,
                                  extra_body={"ignore_eos": True})
    check("client usage counts", r.usage.completion_tokens == 23 and r.usage.prompt_tokens == cfg["prompt_tokens"]
          and r.choices[0].finish_reason == "length", r.usage)

def chat():
    r = client.chat.completions.create(model=M, messages=[{"role": "system", "content": "You tell stories."},
                                       {"role": "user", "content": "Tell me about a cat."}], max_tokens=12, seed=1)
    c = r.choices[0]
    check("client chat", r.object == "chat.completion" and r.id.startswith("chatcmpl-")
          and c.message.role == "assistant" and isinstance(c.message.content, str)
          and c.finish_reason in ("stop", "length") and r.usage.completion_tokens <= 12, r)

def stream_completions():
    text, finish, usage, n = "", None, None, 0
    for ch in client.completions.create(model=M, prompt="Once upon a time", max_tokens=20, temperature=0.8, seed=11,
                                        stream=True, stream_options={"include_usage": True}):
        n += 1
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            text += c.text
            finish = c.finish_reason or finish
    whole = client.completions.create(model=M, prompt="Once upon a time", max_tokens=20, temperature=0.8, seed=11)
    check("client stream completions", n > 3 and finish in ("stop", "length") and usage is not None
          and usage.completion_tokens == whole.usage.completion_tokens, (n, finish, usage))
    check("client stream equals non-stream (completions, seed 11)", text == whole.choices[0].text,
          "%r != %r" % (text, whole.choices[0].text))

def stream_chat():
    msgs = [{"role": "user", "content": "Once upon a time"}]
    text, roles, finish = "", [], None
    for ch in client.chat.completions.create(model=M, messages=msgs, max_tokens=20, temperature=0.7, seed=5,
                                             stream=True):
        for c in ch.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    whole = client.chat.completions.create(model=M, messages=msgs, max_tokens=20, temperature=0.7, seed=5)
    check("client stream chat equals non-stream (seed 5)", roles == ["assistant"] and finish is not None
          and text == whole.choices[0].message.content, "%r / %r, roles %s" % (text, whole.choices[0].message.content,
                                                                                roles))

def n2():
    r = client.completions.create(model=M, prompt="Once upon a time", max_tokens=10, n=2, temperature=1.0, seed=9,
                                  extra_body={"ignore_eos": True})
    check("client n=2", sorted(c.index for c in r.choices) == [0, 1] and r.usage.completion_tokens == 20
          and all(c.finish_reason == "length" for c in r.choices), r)

def stop():
    full = client.completions.create(model=M, prompt="Once upon a time", max_tokens=40, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    words = full.split()
    word = next((w for w in words[2:] if len(w) >= 3), None)
    if word is None:
        check("client stop strings", False, "no word to stop on in %r" % full)
        return
    k = full.find(word)
    r = client.completions.create(model=M, prompt="Once upon a time", max_tokens=40, temperature=0,
                                  stop=["@@never@@", word], extra_body={"ignore_eos": True})
    c = r.choices[0]
    s = "".join(ch.choices[0].text for ch in client.completions.create(
        model=M, prompt="Once upon a time", max_tokens=40, temperature=0, stop=word, stream=True,
        extra_body={"ignore_eos": True}) if ch.choices)
    check("client stop strings", c.text == full[:k] and word not in c.text and c.finish_reason == "stop"
          and s == full[:k], "stop %r: got %r / streamed %r, want %r (%s)" % (word, c.text, s, full[:k],
                                                                          c.finish_reason))

def logprobs():
    r = client.completions.create(model=M, prompt="Once upon a time", max_tokens=6, temperature=0, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    ok = len(lp.tokens) == 6 and len(lp.token_logprobs) == 6 and all(v <= 0 for v in lp.token_logprobs) \
        and all(1 <= len(t) <= 2 for t in lp.top_logprobs) and "".join(lp.tokens) == r.choices[0].text
    c = client.chat.completions.create(model=M, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = c.choices[0].logprobs.content
    ok = ok and len(content) == 4 and all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in content)
    check("client logprobs", ok, (lp, content))

def models():
    ids = [m.id for m in client.models.list()]
    check("client models", ids == [M], ids)

for name, fn in [("completions", completions), ("usage", usage), ("chat", chat), ("stream", stream_completions),
                 ("stream chat", stream_chat), ("n2", n2), ("stop", stop), ("logprobs", logprobs), ("models", models)]:
    run("client " + name, fn)
'''



def openai_python():
    """The venv's python with `openai` importable, or None (with the reason)."""
    venv = os.path.join(CACHE, "venv-openai")
    py = os.path.join(venv, "bin", "python3")
    try:
        if not os.path.exists(py):
            os.makedirs(CACHE, exist_ok=True)
            subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True, timeout=300)
        if subprocess.run([py, "-c", "import openai"], capture_output=True, timeout=120).returncode != 0:
            out = install_out()
            os.write(out, ("installing openai from PyPI into %s (a few MB to download, about 70 MB on disk)\n"
                           % venv).encode())
            subprocess.run([py, "-m", "pip", "install", "--progress-bar", "on", "openai"], check=True,
                           stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=900)
            subprocess.run([py, "-c", "import openai"], check=True, capture_output=True, timeout=120)
        return py, None
    except (subprocess.SubprocessError, OSError) as e:
        return None, "could not install the openai package from PyPI (%s)" % e


def check_client(srv):
    py, why = openai_python()
    if not py:
        skip("openai client checks", why, N_CLIENT_CHECKS)
        return
    cfg = {"base": "http://127.0.0.1:%d/v1" % srv.port, "model": MODEL_NAME,
           "prompt_tokens": tokenize_count("Once upon a time")}
    try:
        r = subprocess.run([py, "-c", CLIENT_SCRIPT, json.dumps(cfg)], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        result("openai client checks", False, "timed out")
        return
    n = 0
    for line in r.stdout.splitlines():
        if line.startswith("PASS ") or line.startswith("FAIL "):
            n += 1
            detail = ""
            result(line[5:], line.startswith("PASS "), detail)
        elif line.startswith("  "):
            print(line)
    if n != N_CLIENT_CHECKS or r.returncode != 0:
        result("openai client script ran every check", False, "%d checks, exit %d\n%s" % (n, r.returncode,
                                                                                          r.stderr[-3000:]))


# ---------------------------------------------------------- 2. errors

def error_shape(body, param=None, code=None):
    """OpenAI's {"error": {"message", "type", "param", "code"}}; param/code checked when given."""
    try:
        e = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    ok = isinstance(e.get("message"), str) and e["message"] and isinstance(e.get("type"), str) and \
        "param" in e and "code" in e
    if param is not None:
        ok = ok and e["param"] == param
    if code is not None:
        ok = ok and e["code"] == code
    return ok


def expect_error(srv, name, path, body, status, param=None, code=None, headers=None, method="POST"):
    try:
        st, hdrs, data = request(srv, method, path, body, headers)
    except OSError as e:
        result(name, False, "request failed: %s" % e)
        return None
    ok = st == status and error_shape(data, param, code)
    result(name, ok, "status %d (want %d), body %r" % (st, status, data[:300]))
    return hdrs


def check_errors(srv):
    C, CH = "/v1/completions", "/v1/chat/completions"
    user = [{"role": "user", "content": "hi"}]
    expect_error(srv, "malformed JSON", C, b'{"prompt": "a", ', 400)
    expect_error(srv, "not an object", C, b'[1, 2]', 400)
    expect_error(srv, "empty body", C, b'', 400)
    expect_error(srv, "prompt of a wrong type", C, {"prompt": 5}, 400, "prompt")
    expect_error(srv, "max_tokens of a wrong type", C, {"prompt": "a", "max_tokens": "8"}, 400, "max_tokens")
    expect_error(srv, "stream of a wrong type", C, {"prompt": "a", "stream": "yes"}, 400, "stream")
    expect_error(srv, "messages of a wrong type", CH, {"messages": "hi"}, 400, "messages")
    expect_error(srv, "message content of a wrong type", CH, {"messages": [{"role": "user", "content": 3}]}, 400,
                 "messages[0].content")
    expect_error(srv, "missing prompt", C, {"max_tokens": 3}, 400, "prompt")
    expect_error(srv, "missing messages", CH, {"max_tokens": 3}, 400, "messages")
    expect_error(srv, "unknown role", CH, {"messages": [{"role": "wizard", "content": "x"}]}, 400,
                 "messages[0].role")
    expect_error(srv, "unknown model", C, {"model": "gpt-17", "prompt": "a"}, 404, "model", "model_not_found")
    expect_error(srv, "unknown model (chat)", CH, {"model": "gpt-17", "messages": user}, 404, "model",
                 "model_not_found")
    expect_error(srv, "invalid UTF-8", C, b'{"prompt": "caf\xc3\x28 \xff"}', 400)
    expect_error(srv, "temperature out of range", C, {"prompt": "a", "temperature": 5}, 400, "temperature")
    expect_error(srv, "top_p out of range", C, {"prompt": "a", "top_p": 1.5}, 400, "top_p")
    expect_error(srv, "n out of range", C, {"prompt": "a", "n": 100}, 400, "n")
    expect_error(srv, "n zero", C, {"prompt": "a", "n": 0}, 400, "n")
    expect_error(srv, "max_tokens zero", C, {"prompt": "a", "max_tokens": 0}, 400, "max_tokens")
    expect_error(srv, "max_tokens past the context", C, {"prompt": "a", "max_tokens": 10 ** 9}, 400, "max_tokens",
                 "context_length_exceeded")
    expect_error(srv, "logit_bias id out of range", C, {"prompt": "a", "logit_bias": {"99999": 1}}, 400, "logit_bias")
    expect_error(srv, "logit_bias value out of range", C, {"prompt": "a", "logit_bias": {"1": 500}}, 400,
                 "logit_bias")
    expect_error(srv, "top_logprobs without logprobs", CH, {"messages": user, "top_logprobs": 2}, 400,
                 "top_logprobs")
    expect_error(srv, "echo with logprobs", C, {"prompt": "a", "echo": True, "logprobs": 1}, 400, "echo")
    long_prompt = "Once upon a time " * 300
    expect_error(srv, "prompt past the context", C, {"prompt": long_prompt, "max_tokens": 1}, 400, "prompt",
                 "context_length_exceeded")
    mid_prompt = "Once upon a time " * 40
    expect_error(srv, "prompt + max_tokens past the context", C, {"prompt": mid_prompt, "max_tokens": CTX - 100},
                 400, "max_tokens", "context_length_exceeded")
    big = json.dumps({"prompt": "x" * (2 << 20)}).encode()
    # a declared length over the limit is refused before the body is sent (as curl does it, with
    # Expect: 100-continue; without it the client may see its upload cut instead of the answer)
    try:
        sk = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(big))
        resp = b""
        while b"\r\n\r\n" not in resp or not resp.rstrip().endswith(b"}"):
            piece = sk.recv(65536)
            if not piece:
                break
            resp += piece
        sk.close()
        head, _, data = resp.partition(b"\r\n\r\n")
        result("body too large (Content-Length)", head.startswith(b"HTTP/1.1 413") and error_shape(data),
               resp[:300])
    except OSError as e:
        result("body too large (Content-Length)", False, str(e))
    # the same without a Content-Length: chunked transfer, cut while receiving
    try:
        c = conn(srv)
        c.putrequest("POST", C)
        c.putheader("Content-Type", "application/json")
        c.putheader("Transfer-Encoding", "chunked")
        c.endheaders()
        for i in range(0, len(big), 65536):
            piece = big[i:i + 65536]
            c.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        c.send(b"0\r\n\r\n")
        r = c.getresponse()
        data = r.read()
        result("body too large (chunked)", r.status == 413 and error_shape(data), "status %d %r" % (r.status, data[:200]))
        c.close()
    except OSError as e:
        result("body too large (chunked)", False, str(e))
    expect_error(srv, "unknown route", "/v2/nothing", None, 404, method="GET")
    expect_error(srv, "unknown /v1 route", "/v1/engines", None, 404, method="GET")
    h = expect_error(srv, "GET on a POST route", C, None, 405, method="GET")
    result("405 names the allowed method", h is not None and h.get("Allow") == "POST", h)
    expect_error(srv, "POST on /health", "/health", {"x": 1}, 405)
    expect_error(srv, "DELETE on /v1/models", "/v1/models", None, 405, method="DELETE")
    # an error the engine finds while generating (every token banned): the request's fault, so 400 with
    # OpenAI's error object, and the same object as a stream's last event; never a finish_reason
    ban = {str(i): -100 for i in range(512)}
    expect_error(srv, "engine error: every token banned (400)", C, {"prompt": "a", "max_tokens": 4, "logit_bias": ban},
                 400)
    try:
        st, events = read_stream(srv, {"prompt": "a", "max_tokens": 4, "stream": True, "logit_bias": ban})
        err = json.loads(events[-2]) if len(events) > 1 else {}
        ok = st == 200 and events[-1] == "[DONE]" and error_shape(events[-2]) and \
            err["error"]["type"] == "invalid_request_error" and not any('"finish_reason":"' in ev for ev in events)
    except (OSError, ValueError, KeyError, IndexError) as e:
        ok, events = False, str(e)
    result("engine error: every token banned (stream ends with the error)", ok, events)
    # the server still works after all of that
    st, _, data = post(srv, C, {"prompt": "Once", "max_tokens": 4})
    result("answers after the errors", st == 200 and json.loads(data)["choices"][0]["finish_reason"], data[:200])


def check_api_key():
    srv = Server("--api-key", "s3cret-key", "--chat-template", "zephyr")
    try:
        C = "/v1/completions"
        body = {"prompt": "Once", "max_tokens": 4}
        expect_error(srv, "API key missing", C, body, 401)
        expect_error(srv, "API key wrong", C, body, 401, headers={"Authorization": "Bearer s3cret-kez"})
        expect_error(srv, "API key prefix only", C, body, 401, headers={"Authorization": "Bearer s3cret"})
        expect_error(srv, "API key without Bearer", C, body, 401, headers={"Authorization": "s3cret-key"})
        expect_error(srv, "API key on /v1/models", "/v1/models", None, 401, method="GET")
        expect_error(srv, "API key on an unknown /v1 route", "/v1/nothing", None, 401, method="GET")
        st, _, data = post(srv, C, body, {"Authorization": "Bearer s3cret-key"})
        result("API key right", st == 200 and json.loads(data)["object"] == "text_completion", data[:200])
        st, _, data = post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                         "max_tokens": 4}, {"Authorization": "Bearer s3cret-key"})
        result("API key right (chat, zephyr)", st == 200 and json.loads(data)["object"] == "chat.completion",
               data[:200])
        result("/health open without key", get(srv, "/health")[0] == 200)
        st, _, data = get(srv, "/metrics")
        result("/metrics open without key", st == 200 and b"lamina_requests_running" in data)
    finally:
        srv.stop("api-key server")


def check_busy():
    srv = Server("--max-seqs", "1", "--max-waiting", "1", "-c", "512", "--ctx-extend")
    try:
        statuses, retry, shapes = [], [], []
        barrier = threading.Barrier(32)

        def one():
            try:
                barrier.wait(10)
                st, h, data = post(srv, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 400,
                                                            "ignore_eos": True})
                with lock:
                    statuses.append(st)
                    if st == 429:
                        retry.append(h.get("Retry-After"))
                        shapes.append(error_shape(data))
            except (OSError, threading.BrokenBarrierError) as e:
                with lock:
                    statuses.append(str(e))

        ts = [threading.Thread(target=one) for _ in range(32)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        n429 = statuses.count(429)
        result("429 when the queue is full", n429 > 0 and statuses.count(200) > 0 and
               all(s in (200, 429) for s in statuses), "statuses %s" % statuses)
        result("429 has Retry-After and an error object", n429 > 0 and all(r and r.isdigit() for r in retry) and
               all(shapes), "Retry-After %s" % retry)
        ok, m = wait_idle(srv)
        result("busy server idle afterwards", ok, m)
    finally:
        srv.stop("busy server")


def check_slow():
    """One sequence at a time, a 1 s request timeout, keep-alive comments every 0.2 s: a long request is cut
    at the timeout with what it has (finish_reason "abort": cut short, not its length), and a stream queued
    behind it receives keep-alive comments while it waits. n above the one sequence is refused naming n."""
    srv = Server("--max-seqs", "1", "-c", "8192", "--ctx-extend", "--timeout", "1", "--keepalive", "0.2", "--idle-timeout", "1")
    try:
        out = {}

        def long_one():
            try:
                out["long"] = post(srv, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8000,
                                                            "ignore_eos": True})
            except OSError as e:
                out["long"] = (str(e), {}, b"")

        t = threading.Thread(target=long_one)
        t.start()
        time.sleep(0.2)
        c = conn(srv)
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": "Once", "max_tokens": 3, "stream": True}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode()
        c.close()
        t.join(120)
        st, _, data = out.get("long", (None, {}, b""))
        try:
            j = json.loads(data)
            ok = st == 200 and j["choices"][0]["finish_reason"] == "abort" and \
                0 < j["usage"]["completion_tokens"] < 8000
        except (ValueError, KeyError, IndexError):
            ok = False
        result("timeout: cut with what it has", ok, "status %s %r" % (st, data[:300]))
        result("keep-alive comments while queued", r.status == 200 and ": keep-alive\n\n" in text and
               text.endswith("data: [DONE]\n\n") and '"finish_reason":"' in text, text[:600])
        expect_error(srv, "n above the engine's sequences", "/v1/completions", {"prompt": "a", "n": 2}, 400, "n")
        ok, m = wait_idle(srv)
        result("slow server idle afterwards", ok, m)
    finally:
        srv.stop("slow server")


def check_stalled():
    """A client that opens a long stream and then reads nothing (without closing) is cut off, by the
    bound on what a stream may hold unsent or by the idle timeout, and its request is cancelled."""
    srv = Server("-c", "8192", "--ctx-extend", "--idle-timeout", "1")
    try:
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 8000, "ignore_eos": True, "stream": True,
                           "logprobs": 5}).encode()
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(30)
        s.connect(("127.0.0.1", srv.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        first = s.recv(1024)
        ok, m = wait_idle(srv, 30)
        s.close()
        result("stalled reader: request cancelled, blocks back", first.startswith(b"HTTP/1.1 200") and ok and
               m.get("lamina_generation_tokens_total", 8000) < 8000, m)
    finally:
        srv.stop("stalled-reader server")


# ----------------------------------------------------- 3. disconnect

def check_disconnect(srv):
    before = metrics(srv).get("lamina_generation_tokens_total", 0)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": CTX - 20, "ignore_eos": True, "stream": True,
                       "temperature": 0.9}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
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
    ok, m = wait_idle(srv)
    result("disconnect: nothing running, every KV block back", ok, m)
    generated = m.get("lamina_generation_tokens_total", 0) - before
    result("disconnect: the request was cancelled early", generated < CTX - 20,
           "%d of %d tokens generated" % (generated, CTX - 20))
    # a client that stops reading is cut off too, not buffered without bound
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    time.sleep(0.3)
    s.close()
    ok, m = wait_idle(srv)
    result("disconnect without reading: blocks back", ok, m)


# ---------------------------------------------------------- 4. load

def read_stream(srv, body, timeout=300):
    """POST a streaming request; returns (status, list of data payloads)."""
    c = conn(srv, timeout)
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        payload = r.read().decode()
        events = [ln[6:] for ln in payload.split("\n") if ln.startswith("data: ")]
        return r.status, events
    finally:
        c.close()


def check_load(srv):
    clients, total = (16, 64) if ASAN else (64, 256)
    todo = list(range(total))
    errors = []
    done = [0]
    rng = random.Random(1234)
    params = [(rng.randint(4, 48), rng.random() < 0.3) for _ in range(total)]

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            max_tokens, two = params[i]
            body = {"prompt": "Once upon a time" if i % 2 else "The little dog", "max_tokens": max_tokens,
                    "stream": True, "temperature": 0.8, "seed": i, "n": 2 if two else 1,
                    "stream_options": {"include_usage": True}}
            try:
                st, events = read_stream(srv, body)
                finishes = set()
                for ev in events[:-1]:
                    j = json.loads(ev)
                    for ch in j.get("choices", []):
                        if ch.get("finish_reason"):
                            finishes.add(ch["index"])
                ok = st == 200 and events and events[-1] == "[DONE]" and finishes == set(range(body["n"]))
                usage = json.loads(events[-2]).get("usage") if len(events) > 1 else None
                ok = ok and usage and usage["completion_tokens"] <= max_tokens * body["n"]
                if not ok:
                    with lock:
                        errors.append("request %d: status %s, %d events, last %r" % (i, st, len(events),
                                                                                      events[-2:]))
            except (OSError, ValueError, http.client.HTTPException) as e:
                with lock:
                    errors.append("request %d: %s" % (i, e))
            with lock:
                done[0] += 1

    t0 = time.time()
    ts = [threading.Thread(target=worker) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(600)
    dt = time.time() - t0
    print("NOTE load: %d requests from %d clients in %.1f s" % (total, clients, dt))
    result("load: every request complete", not errors and done[0] == total,
           "%d failed of %d:\n%s" % (len(errors), total, "\n".join(errors[:10])))
    result("load: healthy afterwards", get(srv, "/health")[0] == 200)
    ok, m = wait_idle(srv)
    result("load: no KV block held at the end", ok, m)
    cnt, s = m.get("lamina_batch_size_count", 0), m.get("lamina_batch_size_sum", 0)
    print("NOTE load: mean batch %.2f sequences over %d iterations" % (s / cnt if cnt else 0, cnt))
    result("load: batches of more than one sequence", cnt > 0 and s / cnt > 1, "sum %s count %s" % (s, cnt))
    buckets = [k for k in m if k.startswith("lamina_batch_size_bucket")]
    result("metrics: histogram buckets", len(buckets) >= 2 and 'lamina_batch_size_bucket{le="+Inf"}' in m and
           m['lamina_batch_size_bucket{le="+Inf"}'] == cnt, buckets)


# ---------------------------------------------------------- 5. fuzz

VALID = [
    b'{"prompt": "Once upon a time", "max_tokens": 8}',
    b'{"prompt": ["a", "b"], "n": 2, "max_tokens": 4, "stop": ["x"], "logprobs": 2}',
    b'{"prompt": [1, 403, 407], "max_tokens": 4, "stream": true, "logit_bias": {"13": -100}}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}',
    b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}], "stream": true, '
    b'"stream_options": {"include_usage": true}, "max_tokens": 3, "logprobs": true, "top_logprobs": 2}',
]
PATHS = ["/v1/completions", "/v1/chat/completions", "/health", "/metrics", "/v1/models", "/", "/v1/models/x",
         "/v1/completions?x=1", "//v1/completions", "/v1/chat/completions/", "/%00", "/" + "a" * 5000]
METHODS = ["POST", "GET", "PUT", "HEAD", "OPTIONS", "DELETE", "PATCH", "BREW", "P\x00ST", ""]


def mutate(rng, data):
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(7)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:
            del b[pos % len(b)]
        elif op == 1:
            b.insert(pos, rng.randrange(256))
        elif op == 2 and b:
            b[pos % len(b)] = rng.randrange(256)
        elif op == 3:
            b[pos:pos] = rng.choice([b"[" * 2000, b"{\"a\":" * 500, b"1e999999", b"-0.0e-99999",
                                     b"99999999999999999999999999", b"\"\\ud800\"", b"\xf4\x90\x80\x80", b"null",
                                     b"\"max_tokens\": -1,", b"\"n\": 1e9,", b"\"prompt\": [[[[]]]],"])
        elif op == 4:
            b = b[:pos]
        elif op == 5:
            b = b + b[:pos]
        else:
            b = b.replace(b"4", str(rng.choice([0, -1, 2 ** 31, 2 ** 64, 10 ** 30])).encode(), 1)
    return bytes(b)


def fuzz_case(rng):
    kind = rng.randrange(6)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 400)))
    body = mutate(rng, rng.choice(VALID)) if kind in (1, 2) else rng.choice(VALID)
    method = rng.choice(METHODS) if kind == 3 else "POST"
    path = rng.choice(PATHS) if kind in (3, 4) else rng.choice(PATHS[:2])
    cl = len(body)
    if kind == 5:
        cl = rng.choice([cl + rng.randint(1, 50), max(0, cl - rng.randint(1, 20)), 10 ** 12, -1])
    headers = ["Host: fuzz", "Content-Type: application/json"]
    if cl >= 0:
        headers.append("Content-Length: %d" % cl)
    if rng.random() < 0.2:
        headers.append(rng.choice(["Authorization: Bearer \xff\xfe", "Transfer-Encoding: chunked",
                                   "Expect: 100-continue", "X-Big: " + "b" * rng.randint(1, 70000),
                                   "Connection: close", "Content-Length: 5", ": empty", "Bad Header",
                                   "Content-Length: abc"]))
    version = rng.choice(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.1 extra", ""]) if kind == 3 else "HTTP/1.1"
    head = "%s %s %s\r\n%s\r\n\r\n" % (method, path, version, "\r\n".join(headers))
    return head.encode("latin-1", "replace") + body


def fuzz_send(port, data, rng):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError as e:
        return "connect: %s" % e
    try:
        s.settimeout(0.3)
        s.sendall(data)
        if rng.random() < 0.5:
            s.shutdown(socket.SHUT_WR)  # no more bytes: incomplete requests end at once
        try:
            while s.recv(65536):
                pass
        except OSError:
            pass
    except OSError:
        pass
    finally:
        s.close()
    return None


def check_fuzz(srv):
    n_cases = 600 if ASAN else 3000
    seed = int(os.environ.get("LAMINA_FUZZ_SEED", "20240601"))
    print("NOTE fuzz: %d cases, seed %d" % (n_cases, seed))
    problems = []
    idx = [0]

    def worker(wid):
        rng = random.Random(seed * 100 + wid)
        while True:
            with lock:
                if idx[0] >= n_cases:
                    return
                idx[0] += 1
                i = idx[0]
            err = fuzz_send(srv.port, fuzz_case(rng), rng)
            if err:
                with lock:
                    problems.append("case %d: %s" % (i, err))
            if i % 250 == 0:
                try:
                    if get(srv, "/health")[0] != 200:
                        with lock:
                            problems.append("case %d: /health not 200" % i)
                except OSError as e:
                    with lock:
                        problems.append("case %d: /health: %s" % (i, e))

    t0 = time.time()
    ts = [threading.Thread(target=worker, args=(w,)) for w in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(900)
    print("NOTE fuzz: %.1f s" % (time.time() - t0))
    alive = srv.proc.poll() is None
    healthy = alive and get(srv, "/health")[0] == 200
    result("fuzz: server alive and healthy", alive and healthy and not problems,
           "alive %s, problems:\n%s" % (alive, "\n".join(problems[:10])))
    ok, m = wait_idle(srv, 60)
    result("fuzz: no KV block held afterwards", ok, m)


# ---------------------------------------------------------------- main

def check_basics(srv):
    st, _, data = get(srv, "/v1/models")
    j = json.loads(data)
    result("GET /v1/models", st == 200 and j["object"] == "list" and j["data"][0]["id"] == MODEL_NAME, data)
    st, _, data = post(srv, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 5, "ignore_eos": True,
                                                 "echo": True})
    j = json.loads(data)
    result("echo prepends the prompt", st == 200 and j["choices"][0]["text"].startswith("Once upon a time") and
           j["usage"]["completion_tokens"] == 5, data[:300])
    st, _, data = post(srv, "/v1/completions", {"prompt": ["Once upon a time", "The dog"], "n": 2, "max_tokens": 3,
                                                 "ignore_eos": True})
    j = json.loads(data)
    result("two prompts, n=2: four choices", st == 200 and [c["index"] for c in j["choices"]] == [0, 1, 2, 3] and
           j["usage"]["completion_tokens"] == 12, data[:300])
    st, _, data = post(srv, "/v1/completions", {"prompt": [1, 403, 407], "max_tokens": 3, "ignore_eos": True})
    j = json.loads(data)
    result("token-id prompt", st == 200 and j["usage"]["prompt_tokens"] == 3, data[:300])
    # the grammar cache in /metrics: a miss compiles, a repeat is a hit, both kept within the cache's bytes
    m0 = metrics(srv)
    texts = []
    for g in ['root ::= "yes" | "no"', 'root ::= "yes" | "no"', 'root ::= [a-z]{3,5}']:
        st, _, data = post(srv, "/v1/completions", {"prompt": "Once", "max_tokens": 6, "grammar": g})
        texts.append(json.loads(data)["choices"][0]["text"] if st == 200 else data)
    m1 = metrics(srv)
    result("grammar requests follow their grammars", texts[0] in ("yes", "no") and texts[1] in ("yes", "no") and
           re.fullmatch(r"[a-z]{3,5}", texts[2]) is not None, texts)
    compiled = m1.get("lamina_grammar_compiles_total", -1) - m0.get("lamina_grammar_compiles_total", 0)
    result("/metrics: two distinct grammars compiled once each, kept, bytes > 0",
           compiled == 2 and m1.get("lamina_grammar_cache_entries", 0) >= 2 and
           m1.get("lamina_grammar_cache_bytes", 0) > 0 and "lamina_grammar_cache_evictions_total" in m1,
           {k: v for k, v in m1.items() if "grammar" in k})


def check_queue_time(srv):
    """The engine's queue time (submission to first admission into a batch): an X-Lamina-Queue-Time header on
    a whole answer, a ": lamina queue_time=" comment before a stream's [DONE]; after 0 and within the request's
    wall time. The openai client's streaming checks (check_client) read streams that carry the comment."""
    for body, what in (({"prompt": "Once upon a time", "max_tokens": 4}, "one choice"),
                       ({"prompt": ["Once", "The dog"], "n": 2, "max_tokens": 3}, "two prompts, n=2")):
        t0 = time.time()
        st, h, data = post(srv, "/v1/completions", body)
        wall = time.time() - t0
        qt = {k.lower(): v for k, v in h.items()}.get("x-lamina-queue-time")
        try:
            v = float(qt)
        except (TypeError, ValueError):
            v = -1
        result("queue time header (%s): after 0, within the request's %.3f s" % (what, wall),
               st == 200 and 0 < v <= wall, "status %d header %r" % (st, qt))
    c = conn(srv)
    try:
        t0 = time.time()
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": "Once", "max_tokens": 4, "stream": True}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode()
        wall = time.time() - t0
    finally:
        c.close()
    lines = text.split("\n")
    qlines = [i for i, l in enumerate(lines) if l.startswith(": lamina queue_time=")]
    done = [i for i, l in enumerate(lines) if l == "data: [DONE]"]
    v = float(lines[qlines[0]].split("=", 1)[1]) if len(qlines) == 1 else -1
    result("queue time comment in a stream, before [DONE], within the request's wall time",
           r.status == 200 and len(qlines) == 1 and len(done) == 1 and qlines[0] < done[0] and 0 < v <= wall,
           text[-300:])
    st, h, _ = post(srv, "/v1/completions", {"prompt": "a", "max_tokens": 4, "logit_bias": {"99999": 1}})
    result("no queue time header on an error", st == 400 and
           "x-lamina-queue-time" not in {k.lower() for k in h}, "status %d %r" % (st, h))


def check_defaults(srv, servers):
    """The server's defaults: a chat request without max_tokens is bounded
    (the rest of this small context here; 1024 at most), the start-up names
    the chat page, and `serve --temp 0 --max-tokens 5` makes a request that
    sets neither greedy and 5 tokens long, while one that sets them wins."""
    msgs = [{"role": "user", "content": "Tell me a story."}]
    page = [l for l in srv.lines if "chat page: http://127.0.0.1:%d/" % srv.port in l]
    result("start-up names the chat page", len(page) == 1, srv.lines)
    st, _, data = post(srv, "/v1/chat/completions", {"messages": msgs, "ignore_eos": True}, timeout=300)
    j = json.loads(data) if st == 200 else {}
    n = j.get("usage", {}).get("completion_tokens", -1)
    result("chat without max_tokens: bounded by the context and by 1024", st == 200 and 0 < n <= min(1024, CTX) and
           j["usage"]["prompt_tokens"] + n <= CTX, (st, data[:300]))
    s3 = Server("--chat-template", "chatml", "--temp", "0", "--max-tokens", "5", "--top-k", "3", "--min-p", "0.2")
    servers.append(s3)
    texts = []
    for _ in range(2):
        st, _, data = post(s3, "/v1/chat/completions", {"messages": msgs, "ignore_eos": True, "seed": len(texts)})
        j = json.loads(data) if st == 200 else {}
        texts.append((st, j.get("choices", [{}])[0].get("message", {}).get("content"),
                      j.get("usage", {}).get("completion_tokens")))
    greedy = post(s3, "/v1/chat/completions", {"messages": msgs, "ignore_eos": True, "temperature": 0,
                                               "max_tokens": 5, "top_k": 0, "min_p": 0})
    gtext = json.loads(greedy[2])["choices"][0]["message"]["content"] if greedy[0] == 200 else None
    result("serve --temp 0 --max-tokens 5: a request setting neither is greedy and 5 tokens long",
           texts[0][0] == 200 and texts[0] == texts[1] and texts[0][2] == 5 and texts[0][1] == gtext, (texts, gtext))
    st, _, data = post(s3, "/v1/completions", {"prompt": "Once", "max_tokens": 9, "ignore_eos": True,
                                               "temperature": 1})
    result("a request's own max_tokens wins over --max-tokens", st == 200 and
           json.loads(data)["usage"]["completion_tokens"] == 9, data[:300])
    st, _, data = post(s3, "/v1/completions", {"prompt": "Once", "ignore_eos": True})
    result("--max-tokens applies to completions too", st == 200 and
           json.loads(data)["usage"]["completion_tokens"] == 5, data[:300])


def main():
    if not os.path.exists(LAMINA):
        result("a lamina binary at %s" % LAMINA, False)
        return summary()
    servers = []
    try:
        srv = Server("--chat-template", "chatml", "-c", str(CTX), "--ctx-extend")
        servers.append(srv)
        ready = [l for l in srv.lines if "listening on http://127.0.0.1:" in l]
        result("start-up line", len(ready) == 1, srv.lines)
        check_basics(srv)
        check_queue_time(srv)
        check_client(srv)
        check_errors(srv)
        check_disconnect(srv)
        check_load(srv)
        check_fuzz(srv)
        check_api_key()
        check_busy()
        check_slow()
        check_stalled()
        check_defaults(srv, servers)
        # no template: chat fails with 400 and start-up said why
        srv2 = Server()
        servers.append(srv2)
        expect_error(srv2, "chat without a template", "/v1/chat/completions",
                     {"messages": [{"role": "user", "content": "hi"}]}, 400, "messages", "chat_template_unavailable")
        result("start-up names the missing template", any("chat" in l and "template" in l for l in srv2.lines),
               srv2.lines)
    except Exception as e:  # a failure to start or an unexpected exception: fail, then stop the servers
        import traceback
        result("e2e_server ran to the end", False, traceback.format_exc())
    finally:
        for i, s in enumerate(servers):
            s.stop("server %d" % i)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
