#!/usr/bin/env python3
"""The chat page at / of `lamina serve`, in a real browser: Debian's chromium
driven by chromium-driver through the `selenium` package (installed from PyPI
into a venv under $LAMINA_CACHE, default ~/.cache/lamina/venv-selenium; the
script then runs itself again with that venv's python). When chromium,
chromium-driver or selenium cannot be had, the browser checks count as
skipped, never as passed.

  1. Over plain HTTP: the page, its script and style are served with the
     security headers (a Content-Security-Policy that allows only the page's
     own script, no inline script; nosniff; no framing); HEAD works, POST is
     refused, the other routes answer as before.
  2. The bundled model (models/stories260K.gguf, --chat-template chatml): the
     page shows the model's name; a message sent with Enter gets its answer
     streamed in, with tokens/s and time to first token; Shift+Enter is a new
     line; the settings reach the request (max tokens caps the answer, a
     system prompt adds prompt tokens); a message with <script> and markdown
     stored as an answer render as text and elements, never as HTML; a reload
     finds the conversation; a new chat starts empty and the old one comes
     back; at phone width nothing overflows sideways. Screenshots go to
     build/webui-chat.png and build/webui-phone.png.
  3. Stop: on a random-weight model of a real shape (mkmodel's "small"
     preset, written into build/ once), a long answer grows while it
     streams; Stop ends it, the server's running count drops to 0, and far
     fewer tokens were generated than asked; Escape in the message box
     stops an answer too; a conversation past the context shows the server's
     400 and what to do.
  4. An API key (--api-key): the page asks for the key, says when a key is
     refused, keeps the right one across a reload.
  5. Reasoning: the bundled model under --chat-template qwen3.5, whose
     generation prompt opens the reasoning (so the whole short answer is
     reasoning): the answer's reasoning is folded in a closed <details>
     above the (empty) answer, holds the streamed text without a think
     marker, opens on a click; a second answer has its own.
  6. SmolLM2-135M-Instruct (testenv.smollm2_gguf(), its own ChatML template):
     "What is the capital of France?" with the system prompt "You are a
     helpful assistant." set in the page gets an answer naming Paris. Skipped
     with the reason while the file does not load, and under AddressSanitizer
     (the server then takes minutes per answer).

Under AddressSanitizer (LAMINA_ASAN) parts 1 to 4 run: they drive the new C
code (the embedded files' routes) and the streaming and cancelling paths of
the server through a real client, and the servers must exit clean.
"""
import http.client
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import testenv  # noqa: E402
from testenv import CACHE, install_out, result, skip, summary  # noqa: E402

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
BUILD = os.path.dirname(LAMINA) or "build"
MODEL = "models/stories260K.gguf"
ASAN = bool(os.environ.get("LAMINA_ASAN"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
N_BROWSER_CHECKS = 43  # what parts 2 to 6 count (each server's clean exit included) when they cannot run

# ----------------------------------------------------------------- set-up

def selenium_python():
    """The venv's python with selenium importable, or (None, why)."""
    venv = os.path.join(CACHE, "venv-selenium")
    py = os.path.join(venv, "bin", "python3")
    try:
        if not os.path.exists(py):
            os.makedirs(CACHE, exist_ok=True)
            subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True, timeout=300)
        if subprocess.run([py, "-c", "import selenium"], capture_output=True, timeout=120).returncode != 0:
            out = install_out()
            os.write(out, ("installing selenium from PyPI into %s\n" % venv).encode())
            subprocess.run([py, "-m", "pip", "install", "--progress-bar", "on", "selenium"], check=True,
                           stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=900)
            subprocess.run([py, "-c", "import selenium"], check=True, capture_output=True, timeout=120)
        return py, None
    except (subprocess.SubprocessError, OSError) as e:
        return None, "could not install selenium from PyPI (%s)" % e


class Server(testenv.Server):
    def __init__(self, model, *args):
        super().__init__([LAMINA, "serve", "-m", model, "-t", "1", *args], start_timeout=300)

    @property
    def url(self):
        return "http://127.0.0.1:%d/" % self.port


def request(srv, method, path, body=None, headers=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def metrics(srv):
    out = {}
    for line in request(srv, "GET", "/metrics")[2].decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def wait_for(fn, timeout=60, step=0.05):
    """fn() until it is true (returned), or its last value after timeout."""
    deadline = time.time() + timeout
    v = fn()
    while not v and time.time() < deadline:
        time.sleep(step)
        v = fn()
    return v


# ---------------------------------------------------------- 1. plain HTTP

def check_http(srv):
    st, h, body = request(srv, "GET", "/")
    csp = h.get("Content-Security-Policy", "")
    result("GET / is the page", st == 200 and h.get("Content-Type", "").startswith("text/html") and
           b'<script src="/webui.js"' in body, (st, h, body[:200]))
    result("page: no inline script in the HTML", len(re.findall(rb"<script\b", body)) == 1 and
           b"onclick" not in body and b"javascript:" not in body, body[:400])
    result("page: CSP allows only its own script and connections",
           "script-src 'self'" in csp and "default-src 'none'" in csp and "connect-src 'self'" in csp and
           "unsafe-inline" not in csp and "unsafe-eval" not in csp and "frame-ancestors 'none'" in csp, csp)
    result("page: nosniff, no framing, no referrer", h.get("X-Content-Type-Options") == "nosniff" and
           h.get("X-Frame-Options") == "DENY" and h.get("Referrer-Policy") == "no-referrer", h)
    st, h, js = request(srv, "GET", "/webui.js")
    result("GET /webui.js", st == 200 and h.get("Content-Type", "").startswith("text/javascript") and
           b"/v1/chat/completions" in js and "script-src 'self'" in h.get("Content-Security-Policy", ""), (st, h))
    result("script: model text is never HTML", b"innerHTML" not in js and b"outerHTML" not in js and
           b"insertAdjacentHTML" not in js and b"document.write" not in js and b"eval(" not in js)
    st, h, css = request(srv, "GET", "/webui.css")
    result("GET /webui.css", st == 200 and h.get("Content-Type", "").startswith("text/css") and len(css) > 100,
           (st, h))
    st, h, b = request(srv, "HEAD", "/")
    result("HEAD /", st == 200 and b == b"", (st, b[:100]))
    st, h, b = request(srv, "POST", "/", body=b"{}", headers={"Content-Type": "application/json"})
    result("POST / is 405", st == 405 and "GET" in h.get("Allow", ""), (st, h, b))
    st, _, b = request(srv, "GET", "/index.html")
    st2, _, _ = request(srv, "GET", "/health")
    result("other routes unchanged (404 for an unknown one, /health 200)", st == 404 and st2 == 200, (st, st2, b))


# ------------------------------------------------------------ the browser

def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="lamina-webui-")
    for a in ["--headless=new", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
              "--disable-extensions", "--disable-background-networking", "--window-size=1100,900",
              "--user-data-dir=" + profile]:
        opts.add_argument(a)
    if os.geteuid() == 0:
        opts.add_argument("--no-sandbox")  # chromium's sandbox refuses to run as root (CI)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(options=opts, service=Service(executable_path=DRIVER))
    d.set_page_load_timeout(120)
    d.set_script_timeout(60)
    d.profile_dir = profile
    return d


def js(d, code, *args):
    return d.execute_script(code, *args)


def answers(d):
    return js(d, "return Array.from(document.querySelectorAll('#log .msg.assistant')).map(e => ({"
                 "state: e.getAttribute('data-state'), text: e.querySelector('.body').textContent, "
                 "stats: (e.querySelector('.stats') || {}).textContent || '', "
                 "note: (e.querySelector('.note') || {}).textContent || '', "
                 "error: (e.querySelector('.error') || {}).textContent || ''}))")


def last_answer(d):
    a = answers(d)
    return a[-1] if a else None


def send(d, text, via_enter=True):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    box = d.find_element(By.ID, "prompt")
    box.clear()
    n = len(answers(d))
    box.send_keys(text)
    if via_enter:
        box.send_keys(Keys.ENTER)
    else:
        d.find_element(By.ID, "send").click()
    wait_for(lambda: len(answers(d)) > n, 30)


def finished(d, timeout=120):
    """The last answer once it is no longer waiting or streaming."""
    return wait_for(lambda: (lambda a: a if a and a["state"] in ("done", "stopped", "error") else None)(
        last_answer(d)), timeout) or last_answer(d)


def set_setting(d, ident, value):
    js(d, "const e = document.getElementById(arguments[0]); e.value = arguments[1];"
          "e.dispatchEvent(new Event('change'));", ident, str(value))


def csp_errors(d):
    try:
        return [e["message"] for e in d.get_log("browser") if e.get("level") == "SEVERE" and
                "favicon" not in e["message"]]
    except Exception:
        return []


# tokens/s is left out when every token came within one read (no time to divide by)
STATS = re.compile(r"^(\d+) tokens(?: · ([\d.]+) tokens/s)? · first token (\d+) ms$")


def check_bundled(d, srv):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    d.get(srv.url)
    name = wait_for(lambda: (lambda t: t if t == "stories260K.gguf" else None)(
        d.find_element(By.ID, "model").text), 60)
    result("page shows the model's name from /v1/models", name == "stories260K.gguf",
           d.find_element(By.ID, "model").text)
    labels = js(d, "return Array.from(document.querySelectorAll('input, textarea')).filter(e => !e.labels || "
                   "!e.labels.length).map(e => e.id)")
    live = js(d, "const l = document.getElementById('log'); return [l.getAttribute('role'), "
                 "l.getAttribute('aria-live')]")
    unnamed = js(d, "return Array.from(document.querySelectorAll('button')).filter(b => "
                    "!(b.textContent.trim() || b.getAttribute('aria-label'))).length")
    result("every field has a label, every button a name, the log is aria-live",
           labels == [] and live == ["log", "polite"] and unnamed == 0, (labels, live, unnamed))
    result("the message box has the focus", js(d, "return document.activeElement.id") == "prompt")
    unset = js(d, "return ['temperature', 'top_p', 'max_tokens'].map(i => document.getElementById(i).value)")
    result("sampling settings start empty: the server's defaults apply", unset == ["", "", ""], unset)

    # Shift+Enter is a new line, nothing sent
    box = d.find_element(By.ID, "prompt")
    box.send_keys("one")
    box.send_keys(Keys.SHIFT, Keys.ENTER)
    box.send_keys("two")
    result("Shift+Enter adds a line and sends nothing", box.get_attribute("value") == "one\ntwo" and
           not answers(d), (box.get_attribute("value"), answers(d)))
    box.clear()

    set_setting(d, "temperature", 0)
    set_setting(d, "max_tokens", 100)
    before = metrics(srv)
    send(d, "Once upon a time, there was a little dog.")
    a = finished(d)
    after = metrics(srv)
    m = STATS.match(a["stats"]) if a else None
    result("Enter sends; the answer streams in and ends", a and a["state"] == "done" and a["text"].strip() and
           not a["error"], a)
    result("answer: tokens, tokens/s and time to first token", bool(m) and int(m.group(1)) ==
           after["lamina_generation_tokens_total"] - before["lamina_generation_tokens_total"] and
           m.group(2) and float(m.group(2)) > 0, (a, after["lamina_generation_tokens_total"] - before["lamina_generation_tokens_total"]))
    result("the request streamed (one request, nothing running now)",
           after["lamina_requests_total"] - before["lamina_requests_total"] == 1 and
           after["lamina_requests_running"] == 0, after)
    first = a["text"]

    # settings reach the request
    set_setting(d, "max_tokens", 5)
    send(d, "Tell me more.")
    a = finished(d)
    m = STATS.match(a["stats"]) if a else None
    result("max tokens setting caps the answer", a and a["state"] == "done" and m and int(m.group(1)) <= 5 and
           ("max tokens" in a["note"] or int(m.group(1)) < 5), a)
    set_setting(d, "max_tokens", 40)
    d.find_element(By.ID, "new-chat").click()
    p0 = metrics(srv)["lamina_prompt_tokens_total"]
    send(d, "Hello.")
    finished(d)
    p1 = metrics(srv)["lamina_prompt_tokens_total"]
    d.find_element(By.ID, "toggle-settings").click()
    result("settings open with the button (aria-expanded)",
           d.find_element(By.ID, "toggle-settings").get_attribute("aria-expanded") == "true" and
           d.find_element(By.ID, "system").is_displayed())
    set_setting(d, "system", "You are a kind storyteller who tells short stories about animals.")
    d.find_element(By.ID, "new-chat").click()
    send(d, "Hello.")
    finished(d)
    p2 = metrics(srv)["lamina_prompt_tokens_total"]
    result("system prompt reaches the request (more prompt tokens)", p2 - p1 > p1 - p0 + 5, (p0, p1, p2))
    set_setting(d, "system", "")

    # a message with HTML in it is text
    d.find_element(By.ID, "new-chat").click()
    evil = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2"> **not bold**'
    send(d, evil)
    finished(d)
    user_text = js(d, "const u = document.querySelectorAll('#log .msg.user'); "
                      "return u[u.length - 1].querySelector('.body').textContent")
    result("a message with <script> renders as text", user_text == evil and
           js(d, "return document.querySelectorAll('#log script, #log img').length") == 0 and
           js(d, "return window.pwned === undefined"), user_text)

    # reload: the conversations are kept
    titles = js(d, "return Array.from(document.querySelectorAll('#chats .open')).map(b => b.textContent)")
    d.refresh()
    wait_for(lambda: d.find_element(By.ID, "model").text == "stories260K.gguf", 60)
    titles2 = js(d, "return Array.from(document.querySelectorAll('#chats .open')).map(b => b.textContent)")
    result("reload keeps the conversations", titles2 == titles and len(titles) == 4, (titles, titles2))
    js(d, "Array.from(document.querySelectorAll('#chats .open')).pop().click()")
    texts = [a["text"] for a in answers(d)]
    result("the first conversation is back after a reload, answers and stats", len(texts) == 2 and
           texts[0] == first and STATS.match(answers(d)[0]["stats"]), texts)
    d.find_element(By.ID, "new-chat").click()
    result("new chat starts empty", answers(d) == [] and
           js(d, "return document.querySelectorAll('#log .msg').length") == 0)

    # markdown of a stored answer: elements made, HTML never parsed
    md = ("Here:\n\n```c\nint main(void) { return 0; } /* <b>not bold</b> */\n```\n\n- one\n- **two**\n"
          "1. first\n2. second\n\n*em* and _em_ and `code <i>` in a snake_case_name.\n\n"
          "1. alpha\n\n2. beta\n\n3. gamma\n\nThen:\n\n7. seven\n8. eight\n\n"
          "<script>window.pwned = 3</script><img src=x onerror=\"window.pwned = 4\">")
    js(d, "const c = JSON.parse(localStorage.getItem('lamina.chats')); c.unshift({id: 'mdtest', title: 'markdown',"
          "messages: [{role: 'user', content: 'show me'}, {role: 'assistant', content: arguments[0]}]});"
          "localStorage.setItem('lamina.chats', JSON.stringify(c)); localStorage.setItem('lamina.current', "
          "JSON.stringify('mdtest'));", md)
    d.refresh()
    wait_for(lambda: answers(d), 30)
    shape = js(d, "const b = document.querySelector('#log .msg.assistant .body'); return {"
                  "code: (b.querySelector('pre > code') || {}).textContent, lang: (b.querySelector('pre > code')"
                  " || {dataset: {}}).getAttribute && b.querySelector('pre > code').getAttribute('data-lang'),"
                  "ul: b.querySelectorAll('ul > li').length, ol: b.querySelectorAll('ol > li').length,"
                  "ols: Array.from(b.querySelectorAll('ol')).map(o => [o.children.length, o.start]),"
                  "strong: Array.from(b.querySelectorAll('strong')).map(e => e.textContent),"
                  "em: Array.from(b.querySelectorAll('em')).map(e => e.textContent),"
                  "icode: Array.from(b.querySelectorAll('p > code')).map(e => e.textContent),"
                  "bad: b.querySelectorAll('script, img, b, i').length, text: b.textContent,"
                  "pwned: window.pwned === undefined}")
    result("markdown: a code block, its text verbatim", shape["code"] ==
           "int main(void) { return 0; } /* <b>not bold</b> */" and shape["lang"] == "c", shape)
    result("markdown: a list with blank lines between its items is one list (1. 2. 3., not 1. 1. 1.), "
           "and a list from 7 starts at 7", shape["ols"] == [[2, 1], [3, 1], [2, 7]], shape["ols"])
    result("markdown: lists, strong, emphasis, inline code", shape["ul"] == 2 and shape["ol"] == 7 and
           shape["strong"] == ["two"] and shape["em"] == ["em", "em"] and shape["icode"] == ["code <i>"] and
           "snake_case_name" in shape["text"], shape)
    result("markdown: HTML in the model's text stays text", shape["bad"] == 0 and shape["pwned"] and
           "<script>window.pwned = 3</script>" in shape["text"], shape)
    errs = csp_errors(d)
    result("no error in the browser's console (CSP or script)", not errs, errs)
    os.makedirs(BUILD, exist_ok=True)
    js(d, "Array.from(document.querySelectorAll('#chats .open')).pop().click()")
    d.save_screenshot(os.path.join(BUILD, "webui-chat.png"))

    # phone width
    d.set_window_size(390, 844)
    time.sleep(0.3)
    wide = js(d, "return [document.documentElement.scrollWidth, window.innerWidth, "
                 "document.getElementById('prompt').getBoundingClientRect().right]")
    result("phone width: nothing wider than the window, the message box on screen",
           wide[0] <= wide[1] and 0 < wide[2] <= wide[1], wide)
    d.save_screenshot(os.path.join(BUILD, "webui-phone.png"))
    d.set_window_size(1100, 900)
    result("screenshots saved", os.path.getsize(os.path.join(BUILD, "webui-chat.png")) > 1000 and
           os.path.getsize(os.path.join(BUILD, "webui-phone.png")) > 1000)


def small_model():
    """build/webui-small-q4_0.gguf: mkmodel's small preset (random weights), made once."""
    path = os.path.join(BUILD, "webui-small-q4_0.gguf")
    if not os.path.exists(path):
        r = subprocess.run([LAMINA, "mkmodel", "-o", path, "--preset", "small", "--type", "Q4_0",
                            "--vocab-from", "tests/data/vocab/ggml-vocab-llama-spm.gguf"],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError("mkmodel: %s" % r.stderr[-2000:])
    return path


def check_stop(d, srv):
    from selenium.webdriver.common.by import By
    d.get(srv.url)
    wait_for(lambda: d.find_element(By.ID, "model").text == "webui-small-q4_0.gguf", 60)
    set_setting(d, "max_tokens", 2000)
    set_setting(d, "temperature", 1)
    # a random model ends an answer (its end-of-text token) about once in 32000 tokens: should that
    # happen before the answer was seen growing, the try is made again in a new chat
    for attempt in range(3):
        before = metrics(srv)
        send(d, "Write a long story.")
        grew = []

        def growing():
            a = last_answer(d)
            if a and a["state"] == "streaming" and a["text"]:
                grew.append(len(a["text"]))
            return (len(grew) >= 2 and grew[-1] > grew[0]) or (a and a["state"] not in ("waiting", "streaming"))
        wait_for(growing, 120, 0.2)
        ok = len(grew) >= 2 and grew[-1] > grew[0] and last_answer(d)["state"] == "streaming"
        if ok:
            break
        print("NOTE stop: the answer ended before it was seen growing (%s); again" % last_answer(d))
        finished(d, 120)
        d.find_element(By.ID, "new-chat").click()
    running = metrics(srv)["lamina_requests_running"]
    result("a long answer grows while it streams", ok, grew)
    result("stop: the request runs on the server before the click", running == 1, running)
    result("stop: the Stop button is shown, Send disabled", d.find_element(By.ID, "stop").is_displayed() and
           not d.find_element(By.ID, "send").is_enabled())
    d.find_element(By.ID, "stop").click()
    a = finished(d, 60)
    result("stop: the answer ends as stopped, its text kept", a["state"] == "stopped" and a["text"] and
           "Stopped" in a["note"] and not a["error"], a)
    m = wait_for(lambda: (lambda x: x if x["lamina_requests_running"] == 0 else None)(metrics(srv)), 30) or \
        metrics(srv)
    gen = m["lamina_generation_tokens_total"] - before["lamina_generation_tokens_total"]
    result("stop: the server's running count drops to 0", m["lamina_requests_running"] == 0, m)
    result("stop: far fewer tokens generated than asked", 0 < gen < 1500, "%d of 2000" % gen)
    result("stop: Send is back, Stop hidden", d.find_element(By.ID, "send").is_enabled() and
           not d.find_element(By.ID, "stop").is_displayed())
    # Escape in the message box stops too (the keyboard's way)
    from selenium.webdriver.common.keys import Keys
    d.find_element(By.ID, "new-chat").click()
    send(d, "Another long story.")
    wait_for(lambda: (last_answer(d) or {}).get("state") != "waiting", 60)
    d.find_element(By.ID, "prompt").send_keys(Keys.ESCAPE)
    a = finished(d, 60)
    m = wait_for(lambda: (lambda x: x if x["lamina_requests_running"] == 0 else None)(metrics(srv)), 30) or \
        metrics(srv)
    if a["state"] == "done":  # the random model's end-of-text came first (rare): no stop to see
        print("NOTE Escape: the answer ended by itself before the key (%s)" % a)
    result("stop: Escape stops an answer too", (a["state"] == "stopped" or (a["state"] == "done" and
           "max tokens" not in a["note"])) and m["lamina_requests_running"] == 0, a)
    # the same conversation asking for the whole context of 2048 tokens no longer fits
    set_setting(d, "max_tokens", 2048)
    send(d, "And another.")
    a = finished(d, 60)
    result("a conversation past the context: the server's 400, with what to do", a["state"] == "error" and
           "maximum context length" in a["error"] and "Start a new chat" in a["error"], a)


def check_key(d, srv):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    d.get(srv.url)
    form = wait_for(lambda: d.find_element(By.ID, "key-form").is_displayed(), 60)
    result("key: the page asks for the key on a 401", form and
           "needs an API key" in d.find_element(By.ID, "key-why").text and
           js(d, "return document.activeElement.id") == "api-key", d.find_element(By.ID, "key-why").text)
    d.find_element(By.ID, "api-key").send_keys("wrong-key", Keys.ENTER)
    refused = wait_for(lambda: d.find_element(By.ID, "key-form").is_displayed() and
                       "refused" in d.find_element(By.ID, "key-why").text, 30)
    result("key: a wrong key is refused and asked again", refused, d.find_element(By.ID, "key-why").text)
    d.find_element(By.ID, "api-key").send_keys("sekret-key", Keys.ENTER)
    name = wait_for(lambda: d.find_element(By.ID, "model").text == "stories260K.gguf", 30)
    result("key: the right key opens the API", name and not d.find_element(By.ID, "key-form").is_displayed(),
           d.find_element(By.ID, "model").text)
    send(d, "Once upon a time")
    a = finished(d)
    result("key: a chat answer with the key", a and a["state"] == "done" and a["text"], a)
    d.refresh()
    name = wait_for(lambda: d.find_element(By.ID, "model").text == "stories260K.gguf", 30)
    result("key: kept across a reload", name and not d.find_element(By.ID, "key-form").is_displayed())


def check_smollm2(d):
    from selenium.webdriver.common.by import By
    n = 2
    if ASAN:
        skip("SmolLM2 in the page", "not under AddressSanitizer (minutes per answer)", n)
        return
    try:
        sys.path.insert(0, HERE)
        import testenv
        path = testenv.smollm2_gguf()
    except (OSError, AttributeError) as e:
        skip("SmolLM2 in the page", "the model cannot be had (%s)" % e, n)
        return
    r = subprocess.run([LAMINA, "info", "-m", path], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
        skip("SmolLM2 in the page", "SmolLM2-135M-Instruct does not load in lamina yet (%s)" % why, n)
        return
    srv = Server(path, "-c", "2048")
    try:
        d.get(srv.url)
        name = wait_for(lambda: d.find_element(By.ID, "model").text == os.path.basename(path), 60)
        result("smollm2: the page shows its name", name, d.find_element(By.ID, "model").text)
        set_setting(d, "temperature", 0)
        set_setting(d, "max_tokens", 60)
        # with the template's default system prompt this small model answers around Paris without
        # naming it (llama.cpp's greedy reply does the same, tests/data/smollm2); this one it answers
        set_setting(d, "system", "You are a helpful assistant.")
        d.find_element(By.ID, "new-chat").click()
        send(d, "What is the capital of France?")
        a = finished(d, 300)
        result("smollm2: the answer names Paris", a and a["state"] == "done" and "Paris" in a["text"], a)
        d.save_screenshot(os.path.join(BUILD, "webui-smollm2.png"))
    finally:
        srv.stop("smollm2 server")


def check_reasoning(d, srv):
    from selenium.webdriver.common.by import By
    d.get(srv.url)
    js(d, "localStorage.clear()")
    d.get(srv.url)
    wait_for(lambda: d.find_element(By.ID, "model").text == "stories260K.gguf", 60)
    set_setting(d, "max_tokens", 24)
    send(d, "Tell me a story.")
    a = finished(d)
    r = js(d, "const e = Array.from(document.querySelectorAll('#log .msg.assistant')).pop();"
              "const det = e.querySelector('details.reasoning');"
              "return det ? {open: det.open, first: e.children[1] === det, summary: det.querySelector('summary')"
              ".textContent, thought: det.querySelector('.thought').textContent} : null")
    result("reasoning: folded in a closed <details> above the answer",
           bool(r) and r["open"] is False and r["first"] and r["summary"].startswith("Reasoning"), r)
    result("reasoning: the streamed text, no think marker, answer empty",
           bool(r) and len(r["thought"]) > 0 and "think>" not in r["thought"] and a["text"] == "" and
           "think>" not in a["text"], (r, a))
    js(d, "Array.from(document.querySelectorAll('#log .msg.assistant')).pop()"
          ".querySelector('details.reasoning summary').click()")
    opened = js(d, "return Array.from(document.querySelectorAll('#log .msg.assistant')).pop()"
                   ".querySelector('details.reasoning').open")
    result("reasoning: opens on a click", opened is True, opened)
    send(d, "Another one.")
    finished(d)
    still = js(d, "return document.querySelectorAll('#log details.reasoning').length")
    result("reasoning: each answer has its own", still == 2, still)


def with_server(fn, name, model, *args):
    srv = Server(model, *args)
    try:
        fn(srv)
    finally:
        srv.stop(name)


def part(name, fn):
    """Run one part; an exception in it is one failure (with its trace), and the next part still runs."""
    try:
        fn()
    except Exception:
        import traceback
        result("%s: ran to the end" % name, False, traceback.format_exc())


def run_browser_parts():
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        skip("browser checks", "chromium or chromium-driver is not installed (scripts/deps.sh installs them)",
             N_BROWSER_CHECKS)
        return
    try:
        d = browser()
    except Exception as e:
        skip("browser checks", "chromium did not start (%s)" % str(e).splitlines()[0], N_BROWSER_CHECKS)
        return
    try:
        part("bundled model", lambda: with_server(lambda s: check_bundled(d, s), "bundled model server", MODEL,
                                                  "--chat-template", "chatml", "-c", "1024", "--ctx-extend"))
        part("stop", lambda: with_server(lambda s: check_stop(d, s), "small model server", small_model(),
                                         "--chat-template", "chatml", "-c", "2048"))

        def key(s):
            d.get(s.url)
            js(d, "localStorage.clear()")
            check_key(d, s)
        part("api key", lambda: with_server(key, "api-key server", MODEL, "--chat-template", "chatml",
                                            "--api-key", "sekret-key"))
        part("reasoning", lambda: with_server(lambda s: check_reasoning(d, s), "qwen3.5 template server", MODEL,
                                              "--chat-template", "qwen3.5", "-c", "1024", "--ctx-extend"))
        part("smollm2", lambda: check_smollm2(d))
    finally:
        d.quit()
        shutil.rmtree(d.profile_dir, ignore_errors=True)


def main():
    srv = Server(MODEL, "--chat-template", "chatml")
    try:
        check_http(srv)
    finally:
        srv.stop("server")
    try:
        import selenium  # noqa: F401
        have = True
    except ImportError:
        have = False
    if have:
        run_browser_parts()
    else:
        skip("browser checks", "selenium is not importable", N_BROWSER_CHECKS)
    return summary()


if __name__ == "__main__":
    try:
        import selenium  # noqa: F401
    except ImportError:
        if not os.environ.get("LAMINA_WEBUI_VENV"):
            py, why = selenium_python()
            if py:
                os.environ["LAMINA_WEBUI_VENV"] = "1"
                sys.stdout.flush()
                os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])
            print("SKIP selenium: %s" % why)
    sys.exit(main())
