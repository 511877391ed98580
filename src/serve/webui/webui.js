/*
 * webui.js - the chat page of lamina serve (served at /webui.js, the only
 * script the page's Content-Security-Policy allows).
 *
 * It talks to the server's own OpenAI routes: GET /v1/models for the model's
 * name, POST /v1/chat/completions with "stream": true for answers (read as
 * server-sent events from the fetch body; the Stop button aborts the fetch,
 * which closes the connection, and the server cancels the request).
 *
 * Invariant: text from the model or the user never becomes HTML. Every node
 * is made with createElement and filled with textContent or text nodes; the
 * small markdown reader below (code blocks, lists, headings, quotes,
 * emphasis, inline code) only chooses which elements to make.
 *
 * Kept in localStorage: the conversations ("lamina.chats": a list of
 * {id, title, messages: [{role, content, reasoning?, stats?, note?, error?}]}), the one
 * shown ("lamina.current"), the settings ("lamina.settings") and the API key
 * ("lamina.key") once the user gave one after a 401.
 */
"use strict";
(function () {
  var K_CHATS = "lamina.chats", K_CUR = "lamina.current", K_SET = "lamina.settings", K_KEY = "lamina.key";

  function $(id) { return document.getElementById(id); }
  function load(k, d) {
    try { var v = localStorage.getItem(k); return v === null ? d : JSON.parse(v); } catch (e) { return d; }
  }
  function save(k, v) {
    try { localStorage.setItem(k, JSON.stringify(v)); } catch (e) { status("Could not save in local storage: " + e.message); }
  }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function status(t) { $("status").textContent = t; }

  var chats = load(K_CHATS, []);
  if (!Array.isArray(chats)) chats = [];
  chats = chats.filter(function (c) { return c && typeof c.id === "string" && Array.isArray(c.messages); });
  /* null: the field is not sent, and the server's default applies */
  var settings = Object.assign({ system: "", temperature: null, top_p: null, max_tokens: null }, load(K_SET, {}));
  var apiKey = load(K_KEY, "");
  var model = null;
  var current = load(K_CUR, null);
  var busy = null;        /* {ctl: AbortController, stopped: bool} while an answer streams */
  var afterKey = null;    /* what to do once a key is given */

  /* ------------------------------------------------------------ markdown */

  /* Inline spans: `code`, **strong**, __strong__, *em*, _em_ (not inside words: the character
   * before is captured, as older browsers have no lookbehind). */
  var INLINE = /`([^`\n]+)`|\*\*(?=\S)([^*]*?\S)\*\*|__(?=\S)([^_]*?\S)__|\*(?=[^\s*])([^*]*?[^\s*])\*|(^|[^\w])_(?=[^\s_])([^_]*?[^\s_])_(?!\w)/g;

  function inline(text, into) {
    var re = new RegExp(INLINE.source, "g"), last = 0, m;
    while ((m = re.exec(text)) !== null) {
      var before = text.slice(last, m.index) + (m[5] || "");
      if (before) into.appendChild(document.createTextNode(before));
      if (m[1] !== undefined) into.appendChild(el("code", null, m[1]));
      else {
        var e = el(m[2] !== undefined || m[3] !== undefined ? "strong" : "em");
        inline(m[2] !== undefined ? m[2] : m[3] !== undefined ? m[3] : m[4] !== undefined ? m[4] : m[6], e);
        into.appendChild(e);
      }
      last = re.lastIndex;
    }
    if (last < text.length) into.appendChild(document.createTextNode(text.slice(last)));
  }

  var FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/, BULLET = /^\s{0,3}[-*+]\s+(.*)$/, NUMBER = /^\s{0,3}\d{1,9}[.)]\s+(.*)$/;
  var HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/, QUOTE = /^\s{0,3}>\s?(.*)$/;

  function blockStart(line) {
    return FENCE.test(line) || BULLET.test(line) || NUMBER.test(line) || HEADING.test(line) || QUOTE.test(line);
  }

  /* Markdown text into the children of `into` (replacing them). */
  function markdown(text, into) {
    var frag = document.createDocumentFragment(), lines = text.split("\n"), i = 0;
    while (i < lines.length) {
      var line = lines[i], m;
      if ((m = FENCE.exec(line))) {
        var code = [], close = m[1];
        for (i++; i < lines.length && lines[i].trim().indexOf(close) !== 0; i++) code.push(lines[i]);
        i++;
        var pre = el("pre"), c = el("code", null, code.join("\n"));
        if (m[2]) c.setAttribute("data-lang", m[2]);
        pre.appendChild(c);
        frag.appendChild(pre);
      } else if (!line.trim()) {
        i++;
      } else if ((m = HEADING.exec(line))) {
        var h = el("h" + Math.min(6, m[1].length + 2));
        inline(m[2], h);
        frag.appendChild(h);
        i++;
      } else if (BULLET.test(line) || NUMBER.test(line)) {
        var re = BULLET.test(line) ? BULLET : NUMBER, list = el(re === BULLET ? "ul" : "ol"), item = null;
        var start = /^\s*(\d+)/.exec(line);
        if (re === NUMBER && start && +start[1] !== 1) list.setAttribute("start", String(+start[1]));
        for (; i < lines.length; i++) {
          var lm = re.exec(lines[i]);
          if (!lines[i].trim()) {
            /* blank lines between items ("loose" lists) keep the list going */
            var j = i + 1;
            while (j < lines.length && !lines[j].trim()) j++;
            if (j < lines.length && (re.test(lines[j]) || (/^\s{2,}/.test(lines[j]) && item))) { i = j - 1; continue; }
            break;
          }
          if (lm) {
            item = el("li");
            inline(lm[1], item);
            list.appendChild(item);
          } else if (lines[i].trim() && /^\s{2,}/.test(lines[i]) && item) {
            item.appendChild(document.createTextNode(" "));
            inline(lines[i].trim(), item);
          } else break;
        }
        frag.appendChild(list);
      } else if (QUOTE.test(line)) {
        var quote = [];
        for (; i < lines.length && (m = QUOTE.exec(lines[i])); i++) quote.push(m[1]);
        var bq = el("blockquote");
        markdown(quote.join("\n"), bq);
        frag.appendChild(bq);
      } else {
        var p = el("p"), first = true;
        for (; i < lines.length && lines[i].trim() && (first || !blockStart(lines[i])); i++) {
          if (!first) p.appendChild(el("br"));
          inline(lines[i], p);
          first = false;
        }
        frag.appendChild(p);
      }
    }
    into.replaceChildren(frag);
  }

  /* ------------------------------------------------------- conversations */

  function chat() { return chats.find(function (c) { return c.id === current; }) || null; }
  function persist() { save(K_CHATS, chats); save(K_CUR, current); }
  function newId() { return Date.now().toString(36) + Math.random().toString(36).slice(2, 8); }

  function newChat() {
    stop();
    var c = chat();
    if (!c || c.messages.length) {
      c = { id: newId(), title: "New chat", messages: [] };
      chats.unshift(c);
    }
    current = c.id;
    persist();
    renderAll();
    $("prompt").focus();
  }

  function openChat(id) {
    stop();
    current = id;
    persist();
    renderAll();
  }

  function deleteChat(id) {
    if (id === current) stop();
    chats = chats.filter(function (c) { return c.id !== id; });
    if (id === current) current = chats.length ? chats[0].id : null;
    persist();
    renderAll();
    $("new-chat").focus();
  }

  function renderList() {
    var ul = $("chats");
    ul.replaceChildren();
    chats.forEach(function (c) {
      var li = el("li"), open = el("button", "open", c.title || "New chat"), del = el("button", "del", "×");
      open.type = del.type = "button";
      open.title = c.title;
      if (c.id === current) open.setAttribute("aria-current", "true");
      open.addEventListener("click", function () { openChat(c.id); });
      del.setAttribute("aria-label", "Delete chat: " + c.title);
      del.addEventListener("click", function () { deleteChat(c.id); });
      li.appendChild(open);
      li.appendChild(del);
      ul.appendChild(li);
    });
  }

  /* One message's element; an assistant's body is markdown, a user's is text.
   * A thinking model's reasoning (the server's reasoning_content) is folded
   * in a <details> above the answer; a repaint keeps it open if it was. */
  function renderMessage(m, box) {
    box = box || el("article");
    var was = box.querySelector("details.reasoning"), open = !!(was && was.open);
    box.className = "msg " + (m.role === "user" ? "user" : "assistant");
    box.replaceChildren(el("span", "who", m.role === "user" ? "You" : "Assistant"));
    if (m.reasoning) {
      var det = el("details", "reasoning"), sum = el("summary", null, m.content ? "Reasoning" : "Reasoning…");
      det.open = open;
      det.appendChild(sum);
      det.appendChild(el("div", "thought", m.reasoning));
      box.appendChild(det);
    }
    var body = el("div", "body");
    if (m.role === "user") body.textContent = m.content;
    else markdown(m.content, body);
    box.appendChild(body);
    if (m.error) box.appendChild(el("p", "error", m.error));
    if (m.note) box.appendChild(el("p", "note", m.note));
    if (m.stats) box.appendChild(el("p", "stats", m.stats));
    return box;
  }

  function renderAll() {
    renderList();
    var log = $("log"), c = chat();
    log.replaceChildren();
    if (c) c.messages.forEach(function (m) { log.appendChild(renderMessage(m)); });
    log.scrollTop = log.scrollHeight;
  }

  /* ------------------------------------------------------------- network */

  function headers() {
    var h = { "Content-Type": "application/json" };
    if (apiKey) h.Authorization = "Bearer " + apiKey;
    return h;
  }

  function askKey(why, then) {
    afterKey = then;
    $("key-why").textContent = why;
    $("key-form").hidden = false;
    $("api-key").value = "";
    $("api-key").focus();
  }

  async function errorText(res) {
    try {
      var j = await res.json();
      if (j && j.error && j.error.message) return j.error.message + " (" + res.status + ")";
    } catch (e) { /* not JSON */ }
    return "HTTP " + res.status;
  }

  async function loadModel() {
    var res;
    try {
      res = await fetch("/v1/models", { headers: headers() });
    } catch (e) {
      $("model").textContent = "(server unreachable)";
      status("Could not reach the server: " + e.message);
      return;
    }
    if (res.status === 401) {
      $("model").textContent = "(API key needed)";
      askKey(apiKey ? "The server refused this API key; enter the right one." : "This server needs an API key.",
             loadModel);
      return;
    }
    if (!res.ok) { status("Could not read the model: " + await errorText(res)); return; }
    var j = await res.json();
    model = j && j.data && j.data[0] ? String(j.data[0].id) : null;
    $("model").textContent = model || "(no model)";
    document.title = (model || "lamina") + " - lamina chat";
    status("");
  }

  function number(v) { var n = parseFloat(v); return isFinite(n) ? n : undefined; }

  function fmtStats(tokens, ttft, rate, approx) {
    var s = tokens + (approx ? " tokens (counted in the stream)" : " tokens");
    if (rate !== null) s += " · " + rate.toFixed(1) + " tokens/s";
    if (ttft !== null) s += " · first token " + Math.round(ttft) + " ms";
    return s;
  }

  function setBusy(on) {
    $("send").disabled = on;
    $("stop").hidden = !on;
    $("log").setAttribute("aria-busy", on ? "true" : "false");
  }

  function stop() {
    if (busy) { busy.stopped = true; busy.ctl.abort(); }
  }

  async function send(text) {
    if (busy) return;
    if (!chat()) newChat();
    var c = chat();
    var history = c.messages.filter(function (m) { return !m.error && m.content; })
      .map(function (m) {
        var h = { role: m.role, content: m.content };
        if (m.reasoning) h.reasoning_content = m.reasoning;
        return h;
      });
    var user = { role: "user", content: text }, answer = { role: "assistant", content: "" };
    c.messages.push(user, answer);
    if (c.title === "New chat" || !c.title) c.title = text.replace(/\s+/g, " ").trim().slice(0, 48) || "New chat";
    persist();
    renderList();
    var log = $("log"), box = renderMessage(answer);
    log.appendChild(renderMessage(user));
    log.appendChild(box);
    box.setAttribute("data-state", "waiting");
    log.scrollTop = log.scrollHeight;

    var messages = [];
    if (settings.system.trim()) messages.push({ role: "system", content: settings.system });
    messages = messages.concat(history, [{ role: "user", content: text }]);
    var body = { messages: messages, stream: true, stream_options: { include_usage: true } };
    if (model) body.model = model;
    ["temperature", "top_p", "max_tokens"].forEach(function (k) {
      var v = number(settings[k]);
      if (v !== undefined) body[k] = k === "max_tokens" ? Math.round(v) : v;
    });

    var me = busy = { ctl: new AbortController(), stopped: false };
    setBusy(true);
    status("Generating…");
    var t0 = performance.now(), tFirst = null, tLast = null, chunks = 0, usage = null, pending = false;
    function paint() {
      pending = false;
      var atEnd = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
      renderMessage(answer, box);
      if (atEnd) log.scrollTop = log.scrollHeight;
    }
    try {
      var res = await fetch("/v1/chat/completions", {
        method: "POST", headers: headers(), body: JSON.stringify(body), signal: me.ctl.signal });
      if (res.status === 401) {
        busy = null;
        setBusy(false);
        status("");
        c.messages.splice(c.messages.indexOf(user), 2);
        persist();
        renderAll();
        $("prompt").value = text;
        askKey(apiKey ? "The server refused this API key; enter the right one." : "This server needs an API key.",
               function () { return loadModel().then(function () { if (model) { $("prompt").value = ""; send(text); } }); });
        return;
      }
      if (!res.ok) {
        answer.error = await errorText(res);
        if (res.status === 400 && /context length/.test(answer.error))
          answer.error += " Start a new chat, or lower max tokens in the settings.";
      } else {
        box.setAttribute("data-state", "streaming");
        var reader = res.body.getReader(), dec = new TextDecoder(), buf = "";
        for (;;) {
          var r = await reader.read();
          if (r.done) break;
          buf += dec.decode(r.value, { stream: true });
          var nl;
          while ((nl = buf.indexOf("\n")) >= 0) {
            var line = buf.slice(0, nl).replace(/\r$/, "");
            buf = buf.slice(nl + 1);
            if (line.indexOf("data:") !== 0) continue;
            var data = line.slice(5).trim();
            if (!data || data === "[DONE]") continue;
            var ev;
            try { ev = JSON.parse(data); } catch (e) { continue; }
            if (ev.error) { answer.error = String(ev.error.message || "error"); continue; }
            if (ev.usage) usage = ev.usage;
            var ch = ev.choices && ev.choices[0];
            if (ch && ch.delta && typeof ch.delta.reasoning_content === "string" && ch.delta.reasoning_content) {
              if (tFirst === null) tFirst = performance.now();
              tLast = performance.now();
              chunks++;
              answer.reasoning = (answer.reasoning || "") + ch.delta.reasoning_content;
              if (!pending) { pending = true; requestAnimationFrame(paint); }
            }
            if (ch && ch.delta && typeof ch.delta.content === "string" && ch.delta.content) {
              if (tFirst === null) tFirst = performance.now();
              tLast = performance.now();
              chunks++;
              answer.content += ch.delta.content;
              if (!pending) { pending = true; requestAnimationFrame(paint); }
            }
            if (ch && ch.finish_reason === "length") answer.note = "Stopped at the max tokens setting.";
          }
        }
      }
    } catch (e) {
      if (!me.stopped) answer.error = "The connection failed: " + e.message;
    }
    var tokens = usage ? usage.completion_tokens : chunks;
    var end = tLast === null ? performance.now() : tLast;
    var rate = tFirst !== null && tokens > 1 && end > tFirst ? (tokens - 1) * 1000 / (end - tFirst) : null;
    if (me.stopped) answer.note = "Stopped.";
    if (tFirst !== null || usage) answer.stats = fmtStats(tokens, tFirst === null ? null : tFirst - t0, rate, !usage);
    busy = null;
    setBusy(false);
    status(me.stopped ? "Stopped." : answer.error ? "Error." : "Done.");
    persist();
    renderMessage(answer, box);
    box.setAttribute("data-state", me.stopped ? "stopped" : answer.error ? "error" : "done");
    log.scrollTop = log.scrollHeight;
  }

  /* ---------------------------------------------------------------- wiring */

  function bindSetting(id, isText) {
    var input = $(id);
    input.value = settings[id] === undefined || settings[id] === null ? "" : settings[id];
    input.addEventListener("change", function () {
      settings[id] = isText ? input.value : input.value === "" ? null : number(input.value);
      save(K_SET, settings);
    });
  }

  function init() {
    bindSetting("system", true);
    bindSetting("temperature");
    bindSetting("top_p");
    bindSetting("max_tokens");
    $("toggle-settings").addEventListener("click", function () {
      var s = $("settings"), open = s.hidden;
      s.hidden = !open;
      this.setAttribute("aria-expanded", open ? "true" : "false");
      if (open) $("system").focus();
    });
    $("forget-key").addEventListener("click", function () {
      apiKey = "";
      try { localStorage.removeItem(K_KEY); } catch (e) { /* nothing kept */ }
      status("The API key is forgotten.");
      loadModel();
    });
    $("key-form").addEventListener("submit", function (e) {
      e.preventDefault();
      apiKey = $("api-key").value.trim();
      save(K_KEY, apiKey);
      $("key-form").hidden = true;
      var then = afterKey;
      afterKey = null;
      if (then) then();
      $("prompt").focus();
    });
    $("new-chat").addEventListener("click", newChat);
    $("stop").addEventListener("click", function () { stop(); $("prompt").focus(); });
    $("composer").addEventListener("submit", function (e) {
      e.preventDefault();
      var t = $("prompt").value;
      if (!t.trim() || busy) return;
      $("prompt").value = "";
      send(t);
    });
    $("prompt").addEventListener("keydown", function (e) {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        $("composer").requestSubmit();
      } else if (e.key === "Escape" && busy) {
        stop();
      }
    });
    if (!chat()) current = chats.length ? chats[0].id : null;
    renderAll();
    loadModel();
    $("prompt").focus();
  }

  document.addEventListener("DOMContentLoaded", init);
})();
