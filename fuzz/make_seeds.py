#!/usr/bin/env python3
"""Write the seed corpora of the fuzz targets into fuzz/seeds/.

Run from the repository root: python3 fuzz/make_seeds.py. The files are
committed; rerunning rewrites them identically (no randomness).

fuzz_chat: byte 0 options, then NUL-separated template, role, content, ...
  Seeds: every template in tests/data/chat/templates with a short
  conversation, plus a few odd conversations (invalid UTF-8, unknown roles,
  no messages, a dangling role).
fuzz_convert: 4-byte little-endian checkpoint length, checkpoint, tokenizer.
  Seeds: a tiny valid llama2.c checkpoint (dim 8, 1 layer) with tied and with
  separate classifiers, with grouped-query attention, and truncated or
  corrupted variants of each part.
fuzz_request: byte 0 picks the route (bit 0: chat; without it, bit 7: the
  embeddings route), then the body; these add limits and odd values to the
  hand-written seeds already there, and embeddings bodies.
fuzz_tokenize: byte 0 picks the tokenizer (bit 0: GPT-2 BPE, else
  SentencePiece) and flags, then the text; these add whitespace runs,
  byte-fallback text, special-token look-alikes and contractions.
fuzz_grammar: GBNF text, a NUL, then bytes for the matcher. Seeds: a JSON
  grammar with a document, every construct, and refused grammars.
fuzz_route: byte 0 picks the part (0 request body, 1 SSE stream, 2 metrics
  text and a response header line, 3 token ids as block keys; bit 2 with 0:
  chat); these are a few of each, with truncated streams, malformed lines,
  and the replica engine's queue time as a stream comment and a header.
fuzz_logits: a saved-logits file (lamina perplexity --save-logits) of 2
  chunks of 4 tokens over a vocabulary of 5, and variants: truncated, one
  byte more, a token outside the vocabulary, another version.
fuzz_gguf: the malformed files of tests/data/gguf_bad under 1 KiB (copied as
  bad_<name>), beside the valid ones already in fuzz/seeds/fuzz_gguf.
fuzz_reasoning: byte 0 options (bit 0 harmony, bit 1 the reasoning open),
  two cut points, then an output text. Seeds: think blocks closed, open,
  cut inside a marker, near-markers; harmony analysis, final and commentary
  calls, an unterminated header.
fuzz_json_schema: the schema of every file in tests/data/schemas (compact
  JSON), plus schemas the compiler refuses (unsupported keywords, patterns
  and formats, bad $refs, unsatisfiable bounds).
"""
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDS = os.path.join(ROOT, "fuzz", "seeds")


def write(target, name, data):
    d = os.path.join(SEEDS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def chat_input(opt, template, msgs):
    parts = [template]
    for role, content in msgs:
        parts += [role, content]
    return bytes([opt]) + b"\0".join(parts)


CONV = [(b"system", b"You are terse."), (b"user", b"Hello!"), (b"assistant", b"Hi."),
        (b"user", b"What is 2+2?")]


def chat_seeds():
    tdir = os.path.join(ROOT, "tests", "data", "chat", "templates")
    for i, name in enumerate(sorted(os.listdir(tdir))):
        with open(os.path.join(tdir, name), "rb") as f:
            text = f.read()
        write("fuzz_chat", "tmpl_" + name.replace(".jinja", ""), chat_input((2 * i + 1) & 0xff, text, CONV))
    write("fuzz_chat", "name_chatml", chat_input(1, b"chatml", CONV[1:]))
    write("fuzz_chat", "name_llama3_nomsg", chat_input(6, b"llama3", []))
    write("fuzz_chat", "bad_utf8", chat_input(3, b"{{ '<|im_start|>' }}",
                                              [(b"user", b"\xff\xfe\xc3(\xe2\x82"), (b"\x80role", b"x")]))
    write("fuzz_chat", "odd_roles", chat_input(8, b"[INST] <<SYS>>",
                                               [(b"tool", b"t"), (b"", b""), (b"assistant", b"a"),
                                                (b"system", b"late system")]))
    write("fuzz_chat", "dangling_role", b"\x05<start_of_turn>\0user")
    # reasoning turns: </think> before, without and after <think>, tool responses
    think = [(b"user", b"q"), (b"assistant", b"<think>\nr\n</think>\n\na"), (b"user", b"<tool_response>\n1"),
             (b"user", b"<tool_response></tool_response>"), (b"assistant", b"x</think>y</think><think>"),
             (b"assistant", b"</think")]
    write("fuzz_chat", "think_qwen3", chat_input(21, b"<|im_start|></think>", think))
    write("fuzz_chat", "think_deepseek_r1", chat_input(25, "<｜Assistant｜></think>".encode(), think))
    write("fuzz_chat", "name_deepseek3", chat_input(1, b"deepseek3", CONV + [(b"system", b"late")]))
    # gpt-oss: the template field is also a tool's JSON (its schema printed as
    # TypeScript); bits 5 and 6 give the answers calls and reasoning
    schema = (b'{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object",'
              b'"properties":{"a":{"type":"array","items":{"type":"object","properties":{"x":{"type":"number"}}}},'
              b'"b":{"oneOf":[{"type":"string","default":"q"},{"type":"integer"}]},"c":{"type":["string","null"]},'
              b'"d":{"type":"string","enum":["p",1,true],"default":"p"},"e":{"type":"object","required":["f"],'
              b'"properties":{"f":{"type":"boolean"}}}},"required":["a"]}}}')
    write("fuzz_chat", "harmony_tools", chat_input(1 | 32 | 64, schema,
                                                   CONV + [(b"assistant", b"<|channel|>final<|message|>x"),
                                                           (b"tool", b"r"), (b"user", b"q")]))


def checkpoint(dim=8, hidden=16, layers=1, heads=2, kv=2, vocab=8, seq=4, shared=True):
    hs = dim // heads
    floats = (vocab * dim + layers * dim + layers * heads * hs * dim + 2 * layers * kv * hs * dim +
              layers * dim * heads * hs + layers * dim + 2 * layers * hidden * dim + layers * dim * hidden +
              dim + 2 * seq * (hs // 2) + (0 if shared else vocab * dim))
    head = struct.pack("<7i", dim, hidden, layers, heads, kv, vocab if shared else -vocab, seq)
    # Deterministic small values, exact in float32.
    body = struct.pack("<%df" % floats, *[((i % 17) - 8) / 16.0 for i in range(floats)])
    return head + body


PIECES = [b"<unk>", b"\n<s>\n", b"\n</s>\n", b"<0x0A>", b" a", b"b", b"", b"hello"]


def tokenizer(pieces=PIECES):
    out = struct.pack("<i", max(len(p) for p in pieces))
    for i, p in enumerate(pieces):
        out += struct.pack("<fi", -float(i), len(p)) + p
    return out


def convert_input(ckpt, tok):
    return struct.pack("<I", len(ckpt)) + ckpt + tok


def convert_seeds():
    tok = tokenizer()
    tied = checkpoint()
    write("fuzz_convert", "ok_tied", convert_input(tied, tok))
    write("fuzz_convert", "ok_separate", convert_input(checkpoint(shared=False), tok))
    write("fuzz_convert", "ok_gqa", convert_input(checkpoint(heads=2, kv=1), tok))
    write("fuzz_convert", "ckpt_truncated", convert_input(tied[:-5], tok))
    write("fuzz_convert", "ckpt_header_only", convert_input(tied[:28], tok))
    write("fuzz_convert", "ckpt_trailing", convert_input(tied + b"\0\0\0\0", tok))
    write("fuzz_convert", "tok_truncated", convert_input(tied, tok[:-3]))
    write("fuzz_convert", "tok_short_vocab", convert_input(tied, tokenizer(PIECES[:5])))
    write("fuzz_convert", "tok_bad_len", convert_input(tied, tok[:8] + struct.pack("<i", -1) + tok[12:]))
    bad = bytearray(tied)
    bad[12:16] = struct.pack("<i", 3)  # n_heads 3 does not divide dim 8
    write("fuzz_convert", "ckpt_bad_heads", convert_input(bytes(bad), tok))


def gguf_seeds():
    bdir = os.path.join(ROOT, "tests", "data", "gguf_bad")
    for name in sorted(os.listdir(bdir)):
        path = os.path.join(bdir, name)
        if name.endswith(".gguf") and os.path.getsize(path) <= 1024:
            with open(path, "rb") as f:
                write("fuzz_gguf", "bad_" + name, f.read())


REQUESTS = {
    "gen_empty_body": (0, b""),
    "gen_limits": (0, b'{"prompt":"x","max_tokens":2147483648,"temperature":1e309,"top_p":-0.0,'
                      b'"top_k":-1,"min_p":2,"seed":18446744073709551616,"n":1,"logprobs":5}'),
    "gen_sampling": (0, b'{"prompt":"Once","max_tokens":4,"temperature":0.7,"top_k":40,"min_p":0.05,'
                        b'"repetition_penalty":1.1,"presence_penalty":0.5,"frequency_penalty":0.5,'
                        b'"logit_bias":{"5":-100,"x":1},"stop":["a","b","c","d","e"],"ignore_eos":true,'
                        b'"echo":false,"stream":true,"stream_options":{"include_usage":true}}'),
    "gen_lone_surrogate": (0, b'{"prompt":"\\ud800 \\udfff","suffix":null,"best_of":1}'),
    "chat_options": (1, b'{"messages":[{"role":"developer","content":"d"},{"role":"user","content":'
                        b'[{"type":"text","text":"hi"}]}],"max_completion_tokens":3,"top_logprobs":2,'
                        b'"response_format":{"type":"text"},"priority":-5,"user":"u","model":"m"}'),
    "chat_tools": (1, b'{"messages":[{"role":"user","content":"x"}],"tools":[],"functions":[]}'),
    "chat_bad_role": (3, b'{"messages":[{"role":"wizard","content":"x"},{"content":"no role"}]}'),
    # structured outputs and tools (bits 3 and 4 pick the llama3 and mistral-v3 families)
    "fmt_json_object": (0, b'{"prompt":"x","max_tokens":4,"response_format":{"type":"json_object"}}'),
    "fmt_json_schema": (3, b'{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",'
                           b'"json_schema":{"name":"n","strict":true,"schema":{"type":"object","properties":'
                           b'{"a":{"type":"integer","minimum":1,"maximum":30},"b":{"enum":["x","y"]},"c":{"type":'
                           b'"array","items":{"$ref":"#/$defs/d"},"maxItems":3}},"required":["a"],"$defs":{"d":'
                           b'{"type":"string","pattern":"^[a-z]{2,4}$"}}}}}}'),
    "fmt_grammar": (0, b'{"prompt":"x","grammar":"root ::= (\\"a\\" | [b-d]+){1,3} tail\\ntail ::= \\"\\\\n\\" # c"}'),
    "fmt_bad_grammar": (1, b'{"messages":[{"role":"user","content":"x"}],"grammar":"root ::= \\"x"}'),
    "fmt_json_schema_field": (1, b'{"messages":[{"role":"user","content":"x"}],"json_schema":{"type":"array",'
                                 b'"prefixItems":[{"type":"boolean"}],"items":false}}'),
    "fmt_two": (0, b'{"prompt":"x","grammar":"root ::= \\"a\\"","json_schema":{}}'),
    "tools_auto": (3, b'{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":'
                      b'{"name":"get_weather","description":"d","parameters":{"type":"object","properties":'
                      b'{"city":{"type":"string","maxLength":9}},"required":["city"]}}},{"type":"function",'
                      b'"function":{"name":"t"}}]}'),
    "tools_named_llama3": (11, b'{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":'
                               b'{"name":"f","parameters":{"type":"object"}}}],"tool_choice":{"type":"function",'
                               b'"function":{"name":"f"}},"parallel_tool_calls":false}'),
    "tools_required_mistral": (19, b'{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",'
                                   b'"function":{"name":"f"}}],"tool_choice":"required"}'),
    "tools_round_trip": (3, b'{"messages":[{"role":"system","content":"s"},{"role":"user","content":"x"},'
                            b'{"role":"assistant","content":null,"tool_calls":[{"id":"abc123XYZ","type":"function",'
                            b'"function":{"name":"f","arguments":"{\\"a\\": [1, \\"\\u00e9\\"]}"}},'
                            b'{"id":"2","type":"function","function":{"name":"g","arguments":"not json"}}]},'
                            b'{"role":"tool","tool_call_id":"abc123XYZ","content":"r1"},{"role":"tool",'
                            b'"tool_call_id":"2","content":[{"type":"text","text":"r2"}]},{"role":"user",'
                            b'"content":"y"}],"tools":[{"type":"function","function":{"name":"f"}}],'
                            b'"tool_choice":"auto"}'),
    "tools_bad": (1, b'{"messages":[{"role":"tool","content":"x"}],"tools":[{"type":"function","function":'
                     b'{"name":"a b"}}],"tool_choice":{"type":"function","function":{"name":"zz"}}}'),
    "thinking_off": (35, b'{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":'
                        b'"<think>r</think>a"},{"role":"user","content":"q2"}],'
                        b'"chat_template_kwargs":{"enable_thinking":false,"x":[1]}}'),
    "thinking_bad": (35, b'{"messages":[{"role":"user","content":"q"}],"chat_template_kwargs":{"enable_thinking":0}}'),
    "harmony": (131, b'{"messages":[{"role":"system","content":"s"},{"role":"user","content":"q"},{"role":"assistant",'
                     b'"content":"c","reasoning_content":"r","tool_calls":[{"id":"1","type":"function","function":'
                     b'{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"1","content":"ok"},'
                     b'{"role":"assistant","content":"a","thinking":"t"}],"tools":[{"type":"function","function":'
                     b'{"name":"f","description":"d"}}],"reasoning_effort":"high","chat_template_kwargs":'
                     b'{"reasoning_effort":"low","model_identity":"You are X."}}'),
    "harmony_bad": (131, b'{"messages":[{"role":"assistant","content":"a","reasoning":5}],"reasoning_effort":"max"}'),
    # the embeddings route (byte 0: bit 7 set, bit 0 clear; bit 3 a server that refuses them)
    "embed_string": (128, b'{"input":"Once upon a time","model":"stories260K.gguf"}'),
    "embed_strings": (128, b'{"input":["a cat","the dog",""],"encoding_format":"base64","dimensions":3}'),
    "embed_ids": (128, b'{"input":[1,2,3,511],"encoding_format":"float","user":"u","normalize":false}'),
    "embed_lists": (128, b'{"input":[[1,2],[3],[512]],"dimensions":9}'),
    "embed_mixed": (128, b'{"input":[[1,2],"a",3],"encoding_format":"hex"}'),
    "embed_refused": (136, b'{"input":"a"}'),
}


TEXTS = {
    "spaces_sp": (0, b"  a\t\tb \n\n\n   c   "),
    "spaces_bpe": (1, b"  a\t\tb \n\n\n   c   "),
    "bytes_sp": (6, "日本語 😀́ \x00".encode() + b"\xc0\xaf\xed\xa0\x80"),
    "contractions_bpe": (3, b"I'm we'll they've 'S 123456789 ____ ..."),
    "specials_bpe": (7, b"<|endoftext|>x<|endoftext|<s></s><unk><0x41>"),
    "specials_sp": (30, b"<s>Once</s><unk> <0x0A><0xZZ>"),
}


def tokenize_seeds():
    for name, (opt, text) in TEXTS.items():
        write("fuzz_tokenize", name, bytes([opt]) + text)


def request_seeds():
    for name, (opt, body) in REQUESTS.items():
        write("fuzz_request", name, bytes([opt]) + body)


REFUSED_SCHEMAS = {
    "bad_not": b'{"not":{}}',
    "bad_pattern_lookahead": b'{"type":"string","pattern":"(?=a)b"}',
    "bad_pattern_backref": b'{"pattern":"(a)\\\\1"}',
    "bad_format": b'{"format":"hostname"}',
    "bad_ref_remote": b'{"$ref":"http://example.com/s.json"}',
    "bad_ref_missing": b'{"$ref":"#/$defs/x"}',
    "bad_ref_loop": b'{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}',
    "bad_bounds": b'{"type":"integer","minimum":5,"maximum":4}',
    "bad_oneof_overlap": b'{"oneOf":[{"type":"integer"},{"type":"number"}]}',
    "bad_truncated": b'{"type":"object","properties":{"a":',
}


def schema_seeds():
    import json
    sdir = os.path.join(ROOT, "tests", "data", "schemas")
    for name in sorted(os.listdir(sdir)):
        if name.endswith(".json"):
            with open(os.path.join(sdir, name), encoding="utf-8") as f:
                schema = json.load(f)["schema"]
            write("fuzz_json_schema", name[:-5],
                  json.dumps(schema, ensure_ascii=False, separators=(",", ":")).encode())
    for name, data in REFUSED_SCHEMAS.items():
        write("fuzz_json_schema", name, data)


JSON_GBNF = b"""root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\\"" ( [^"\\\\\\x7F\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\\n" [ \\t]{0,20}
"""


def grammar_seeds():
    write("fuzz_grammar", "json", JSON_GBNF + b"\0" + b'{"a": [1, 2.5e3, "x\\u00e9\xc3\xa9", {"b": null}], "c": true}')
    write("fuzz_grammar", "constructs",
          b'# every construct\nroot ::= a b{2} c{1,} d{0,3} e? f* (g | h)+ "\\x41\\u00e9\\U0001F600" . [^a-z\\]]\n'
          b'a ::= "a"\nb ::= [b-c]\nc ::= "c"\nd ::= "d" | "dd"\ne ::= "e"\nf ::= "f"\ng ::= "g"\nh ::= "h"\n'
          b"\0abbcccddeffgh\x41\xc3\xa9\xf0\x9f\x98\x80zZ")
    write("fuzz_grammar", "recursion", b'root ::= p\np ::= "(" p ")" p | ""\n\0(()(()))()')
    # stacks doubling with every x: the probe (odd first byte) and then the matcher pass their bounds
    write("fuzz_grammar", "ambiguous", b'root ::= r*\nr ::= "x" r* "a"? | "x" r* "b"? | "x"\n\0y' + b"x" * 20)
    write("fuzz_grammar", "continued", b'root ::= "x"\n     | "y" [\xe4\xb8\xad-\xe4\xb9\x80]+\n\0y\xe4\xb8\xad\xe4')
    write("fuzz_grammar", "left_recursive", b'root ::= root "a" | "b"\0ba')
    write("fuzz_grammar", "nullable_repeat", b'root ::= ("a"?)*\0aa')
    write("fuzz_grammar", "undefined", b"root ::= missing\0")
    write("fuzz_grammar", "unterminated", b'root ::= "abc\0abc')
    write("fuzz_grammar", "bad_escape", b'root ::= "\\q" [\\x4]\0')


CHUNK = (b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" a",'
         b'"finish_reason":null}]}\n\n')
ROUTE = {
    "peek_completion": (0, b'{"prompt":"Once upon a time, in a land far away, there lived a king who had three '
                           b'daughters and one old dog.","stream":true,"max_tokens":8}'),
    "peek_chat": (4, b'{"messages":[{"role":"system","content":"You tell stories."},{"role":"user","content":'
                     b'[{"type":"text","text":"hi"},{"type":"image"}]},{"role":7}],"stream":false}'),
    "peek_bad": (0, b'{"prompt":["a",'),
    "sse_whole": (1, b": keep-alive\n\n" + CHUNK * 3 + b"data: [DONE]\n\n"),
    "sse_truncated": (1, CHUNK * 2 + b'data: {"id":"cmpl-1","choi'),
    "sse_error": (5, CHUNK + b'data: {"error":{"message":"x","type":"server_error"}}\r\n\r\ndata: [DONE]\r\n'),
    "sse_long_line": (9, b"data: " + b"x" * 2000 + b"\n\ndata:[DONE]\n"),
    "sse_queue_time": (1, CHUNK * 2 + b": lamina queue_time=0.012345\n\ndata: [DONE]\n\n"),
    "sse_queue_time_odd": (13, b": lamina queue_time=\r\n: lamina queue_time=1e999\n: lamina queue_time=-1\n"
                              b": lamina queue_time=1..2\n: lamina queue_time=" + b"9" * 600 + b"\n"
                              b": lamina queue_time= 0.5 \r\n" + CHUNK),
    "queue_header": (2, b"X-Lamina-Queue-Time: 0.250000\r\n"),
    "queue_header_odd": (2, b"x-lamina-queue-time:nan\r\n"),
    "metrics": (2, b"# HELP lamina_requests_running r\n# TYPE lamina_requests_running gauge\n"
                   b"lamina_requests_running 3\nlamina_requests_waiting 1\nlamina_kv_blocks_free 120\n"
                   b"lamina_kv_blocks_total 128\nlamina_iterations_total 1e3\nlamina_batch_size_sum 4000\n"
                   b"lamina_batch_size_count 1000\nlamina_requests_running_x 9\n"),
    "metrics_odd": (6, b"lamina_requests_running\nlamina_requests_waiting nan\nlamina_kv_blocks_free -1\n"
                       b"lamina_kv_blocks_total " + b"9" * 80 + b"\n"),
    "tokens": (63, struct.pack("<40i", *range(1, 41))),
}


def route_seeds():
    for name, (opt, body) in ROUTE.items():
        write("fuzz_route", name, bytes([opt]) + body)


def reasoning_seeds():
    think = [
        (0, b"<think>\nLet me think.\n</think>\n\nThe answer."),
        (2, b"Thinking.\n</think>\n\nAnswer."),
        (2, b"<think>again</think>A</think>B"),
        (0, b"  <thin"),
        (2, b"cut at </thi"),
        (0, b"no block at all <think> later"),
        (2, b"r</think>\n\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>"),
    ]
    harmony = [
        (1, b"<|channel|>analysis<|message|>Why.<|end|><|start|>assistant<|channel|>final<|message|>4"),
        (1, b"<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary to=functions.f "
            b"<|constrain|>json<|message|>{\"a\":1}<|call|>"),
        (1, b"<|start|>assistant to=functions.g<|channel|>commentary json<|message|>{}"),
        (1, b"<|channel|>analysis"),
        (1, b"<|channel|>final<|message|>done<|return|>"),
    ]
    for i, (opt, text) in enumerate(think + harmony):
        n = len(text)
        write("fuzz_reasoning", "case%02d" % i, bytes([opt, (n // 3) & 0xff, (2 * n // 3) & 0xff]) + text)


def logits_seeds():
    import struct
    def hdr(v=5, ctx=4, chunks=2, first=2, ver=1):
        return b"LMLOGITS" + struct.pack("<6I", ver, v, ctx, chunks, first, 0) + bytes(range(32))
    toks = struct.pack("<8i", 2, 1, 4, 0, 2, 3, 3, 1)
    rows = b"".join(struct.pack("<5f", *[0.5 * i - k for i in range(5)]) for k in range(2 * 1))
    ok = hdr() + toks + rows
    write("fuzz_logits", "valid", ok)
    write("fuzz_logits", "truncated", ok[:-3])
    write("fuzz_logits", "one_more", ok + b"\0")
    write("fuzz_logits", "bad_token", hdr() + struct.pack("<8i", 2, 1, 9, 0, 2, 3, 3, 1) + rows)
    write("fuzz_logits", "version2", hdr(ver=2) + toks + rows)
    write("fuzz_logits", "header_only", hdr())


if __name__ == "__main__":
    logits_seeds()
    route_seeds()
    gguf_seeds()
    request_seeds()
    tokenize_seeds()
    chat_seeds()
    convert_seeds()
    schema_seeds()
    grammar_seeds()
    reasoning_seeds()
