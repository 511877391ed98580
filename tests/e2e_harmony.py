#!/usr/bin/env python3
"""End-to-end checks of gpt-oss's chat format (harmony) in `lamina serve`,
on a random-weight model with the o200k_harmony stand-in vocabulary
(tests/data/vocab/ggml-vocab-harmony.gguf) served with --chat-template
gpt-oss:

  - a conversation with tools, tool calls, tool results, an answer's
    reasoning (reasoning_content) and reasoning_effort "high" is rendered as
    the real template renders it: the request's prompt_tokens equal the
    token count (`lamina tokenize`) of the jinja2 render recorded in
    tests/data/chat/tools_golden_gpt-oss-120b.txt, its fixed date replaced
    by today's; the same with chat_template_kwargs.reasoning_effort; and
    the conversation's prompt is longer than the same request without its
    reasoning, which the template writes as the analysis before the call;
  - a bad reasoning_effort is a 400 naming the field;
  - generation ends on <|return|> and <|call|> but not on <|end|> (each made
    the likeliest token by logit_bias), and <|end|>, a framing token, comes
    out as text.
"""
import datetime
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
VOCAB = os.path.join(HERE, "data", "vocab", "ggml-vocab-harmony.gguf")
GOLDEN = os.path.join(HERE, "data", "chat", "tools_golden_gpt-oss-120b.txt")
GOLDEN_DATE = "2025-08-05"  # make_tools_golden.py's FIXED_DATE
import testenv  # noqa: E402 (tests/ is the script's folder)
from testenv import result, summary  # noqa: E402


def post(srv, body):
    """POST /v1/chat/completions: (status, the JSON answer)."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=300)
    try:
        c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        c.close()


def golden_case(name, gen=1):
    """One case of the golden file: (tools, messages in OpenAI's form, the
    effort or None, the rendered text)."""
    data = open(GOLDEN, "rb").read()
    p = data.index(("case gpt-oss-120b %d %s " % (gen, name)).encode())
    p = data.index(b"\n", p) + 1
    tools, msgs, effort = [], [], None

    def counted(head):
        nonlocal p
        n = int(head.split()[-1])
        text = data[p:p + n].decode("utf-8")
        p += n + 1
        return text

    while True:
        e = data.index(b"\n", p)
        line = data[p:e].decode()
        p = e + 1
        if line.startswith("effort "):
            effort = line.split()[1]
        elif line.startswith("tool "):
            tools.append(json.loads(counted(line)))
        elif line.startswith("msg "):
            msgs.append({"role": line.split()[1], "content": counted(line)})
        elif line.startswith("call "):
            _, cid, fn, _ = line.split()
            msgs[-1].setdefault("tool_calls", []).append(
                {"id": cid, "type": "function", "function": {"name": fn, "arguments": counted(line)}})
        elif line.startswith("callid "):
            msgs[-1]["tool_call_id"] = line.split()[1]
        elif line.startswith("think "):
            msgs[-1]["reasoning_content"] = counted(line)
        elif line.startswith("ok "):
            return tools, msgs, effort, counted(line)
        else:
            raise ValueError("golden line %r" % line)


def n_tokens(model, text):
    r = subprocess.run([LAMINA, "tokenize", "-m", model, "--ids"], input=text.encode(), capture_output=True,
                       timeout=300)
    return len(r.stdout.split()) if r.returncode == 0 else -1


def token_id(model, text):
    r = subprocess.run([LAMINA, "tokenize", "-m", model, "--ids"], input=text.encode(), capture_output=True,
                       timeout=300)
    ids = r.stdout.split()
    return int(ids[0]) if r.returncode == 0 and len(ids) == 1 else None


def main():
    tmp = tempfile.mkdtemp(prefix="lamina-harmony-")
    model = os.path.join(tmp, "harmony.gguf")
    r = subprocess.run([LAMINA, "mkmodel", "-o", model, "--layers", "2", "--embd", "64", "--heads", "4",
                        "--kv-heads", "2", "--ff", "128", "--ctx", "4096", "--vocab-from", VOCAB, "--seed", "7"],
                       capture_output=True, text=True, timeout=300)
    result("mkmodel writes a model with the harmony vocabulary", r.returncode == 0, r.stderr)
    srv = None
    try:
        srv = testenv.Server([LAMINA, "serve", "-m", model, "-t", "1", "--chat-template", "gpt-oss"])
        tools, msgs, effort, text = golden_case("harmony_calls")
        today = datetime.date.today().strftime("%Y-%m-%d")
        want = n_tokens(model, text.replace("Current date: " + GOLDEN_DATE, "Current date: " + today))
        base = {"messages": msgs, "tools": tools, "max_tokens": 1, "temperature": 0}
        st, a = post(srv, dict(base, reasoning_effort=effort))
        got = a.get("usage", {}).get("prompt_tokens")
        result("the conversation renders as the template does (%s prompt tokens)" % got,
               st == 200 and want > 100 and got == want, (st, a, want))
        st, a = post(srv, dict(base, chat_template_kwargs={"reasoning_effort": effort}))
        result("reasoning_effort through chat_template_kwargs", st == 200 and
               a.get("usage", {}).get("prompt_tokens") == want, (st, a))
        bare = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in msgs]
        st, a = post(srv, dict(base, messages=bare, reasoning_effort=effort))
        result("an answer's reasoning is in the prompt", st == 200 and
               0 < a.get("usage", {}).get("prompt_tokens", 0) < want, (st, a))
        for body, param in (({"reasoning_effort": "extreme"}, "reasoning_effort"),
                            ({"chat_template_kwargs": {"reasoning_effort": 3}}, "chat_template_kwargs")):
            st, a = post(srv, dict(base, **body))
            result("a bad effort is a 400 naming %s" % param, st == 400 and a.get("error", {}).get("param") == param,
                   (st, a))
        user = [{"role": "user", "content": "Hi"}]
        for tok, ends in (("<|return|>", True), ("<|call|>", True), ("<|end|>", False)):
            tid = token_id(model, tok)
            st, a = post(srv, {"messages": user, "max_tokens": 3, "temperature": 0, "logit_bias": {str(tid): 100}})
            ch = (a.get("choices") or [{}])[0]
            text = (ch.get("message") or {}).get("content") or ""
            ok = st == 200 and tid is not None and ch.get("finish_reason") == ("stop" if ends else "length")
            if not ends:
                ok = ok and text == tok * 3  # a framing token: kept in the text
            result("%s %s generation" % (tok, "ends" if ends else "does not end"), ok, (tid, st, a))
    except Exception:
        import traceback
        result("e2e_harmony ran to the end", False, traceback.format_exc())
    finally:
        if srv:
            srv.stop("harmony")
        shutil.rmtree(tmp, ignore_errors=True)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
