#!/usr/bin/env python3
"""`lamina bench --roofline` and the KV sweep of `lamina bench -d`, end to end,
on random-weight files of mkmodel's presets (llama, gemma2 with sliding
windows, qwen3moe with experts, deepseek2 with latent attention):

  - the roofline JSON has every documented field (bench's usage text lists
    them), for each scenario and op;
  - sums: the op times add up to ops_s, each op's kernel and gap times to its
    time, and the ops cover the step time within OPS_MARGIN (what lies
    outside them: fwd_run's checks before the first timer);
  - the KV bytes a decode step reads equal the formula
    2 x layers x tokens x kv_heads x head_dim x bytes (tokens = position + 1,
    capped at the window on gemma2's sliding-window layers; deepseek2's
    latent cache: layers x tokens x (kv_lora_rank + n_rot) x bytes), averaged over
    the timed steps (positions depth + 2 .. depth + 2 + n - 1: two untimed
    steps first), for F16 and Q8_0 caches; the writes are one token's;
  - the SVGs are well-formed XML, the roofline one point per op the JSON
    says was plotted (and no other), the stacked bar one bar per decode
    scenario;
  - `-d 0,64,...` reports per depth the counted KV bytes equal to the
    formula, and the crossover depth where they pass the weights;
  - bad arguments are refused with exit 2.
Under AddressSanitizer (LAMINA_ASAN set) only the first roofline run is made.
"""
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testenv import result, summary  # noqa: E402 (tests/ is the script's folder)

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
ASAN = bool(os.environ.get("LAMINA_ASAN"))  # under AddressSanitizer: one roofline run, and the sweeps
OPS_MARGIN = 0.15
SVG_NS = "{http://www.w3.org/2000/svg}"
# preset: layers, kv_heads, head_dim, window, pattern (every pattern-th layer global)
PRESETS = {
    "small": (8, 4, 64, 0, 0),
    "gemma2-small": (4, 2, 128, 128, 2),
    "qwen3moe-small": (4, 2, 128, 0, 0),
    "deepseek2-small": (4, 1, 160, 0, 0),  # the latent row: kv_lora_rank 128 + n_rot 32
    "qwen35-small": (2, 2, 128, 0, 0),  # the 2 attention layers of 8; the 6 others keep a state
}
# recurrent layers: the state read and written per decode step, whatever the depth: per layer
# the conv window ((4 - 1) x 512 channels) and 4 value heads' 64 x 64 matrices, F32
STATE = {"qwen35-small": 2 * 6 * 4 * (3 * 512 + 4 * 64 * 64)}
# latent attention: one cache row per token and layer (the value is the row's
# latent), so the formula counts 1 row where K and V count 2
LATENT = {"deepseek2-small"}


def rows(preset):
    return 1 if preset in LATENT else 2
KV_BYTES = {"F16": 2.0, "Q8_0": 34.0 / 32.0, "F32": 4.0}
TOP_FIELDS = ["model", "threads", "isa", "kv_type", "read_bw_gbs", "peak_gflops", "ridge_flop_per_byte", "scenarios"]
SCEN_FIELDS = ["name", "kind", "depth", "batch", "passes", "tokens", "step_s", "ops_s", "other_s", "gap_s",
               "pool_runs", "wake_s", "per_token", "ops"]
PER_TOKEN = ["weight_bytes", "kv_read_bytes", "kv_write_bytes", "kv_read_global_bytes", "kv_read_local_bytes",
             "act_bytes", "state_bytes", "flops"]
OP_FIELDS = ["op", "time_s", "kernel_s", "gap_s", "weight_bytes", "kv_read_bytes", "kv_write_bytes", "act_bytes",
             "bytes", "flops", "intensity", "gbs", "gflops", "bound", "roof_gflops", "pct_of_roof", "plotted"]
OPS = ["embedding", "norms", "q/k/v matmul", "rope", "attention", "linear attention", "output matmul",
       "ffn gate+up matmul", "ffn activation", "ffn down matmul", "lm head"]

def near(a, b, rel=1e-6):
    return abs(a - b) <= rel * max(1.0, abs(b))


def local(preset, i):
    _, _, _, w, pat = PRESETS[preset]
    return w > 0 and (pat == 0 or (i + 1) % pat != 0)


def kv_read_formula(preset, pos, b):
    """KV bytes one decode token at position pos reads."""
    layers, kvh, hd, w, _ = PRESETS[preset]
    t = 0.0
    for i in range(layers):
        tokens = min(pos + 1, w) if local(preset, i) else pos + 1
        t += rows(preset) * tokens * kvh * hd * b
    return t


def run(args, timeout=600):
    return subprocess.run([LAMINA] + args, capture_output=True, text=True, timeout=timeout)


def check_roofline(preset, path, kv, tmp, batch=1):
    svg_dir = os.path.join(tmp, "svg-%s-%s-%d" % (preset, kv, batch))
    n_gen, depth = 6, 200
    r = run(["bench", "-m", path, "--roofline", "-o", "json", "-d", str(depth), "-n", str(n_gen), "-p", "40",
             "-t", "2", "--kv-type", kv, "--svg", svg_dir, "-b", str(batch)])
    tag = "%s_%s_b%d" % (preset, kv, batch)
    if r.returncode != 0:
        result("roofline_runs_" + tag, False, r.stderr[-2000:])
        return
    try:
        js = json.loads(r.stdout)
    except ValueError as e:
        result("roofline_json_" + tag, False, "%s: %s" % (e, r.stdout[:500]))
        return
    missing = [f for f in TOP_FIELDS if f not in js]
    for s in js.get("scenarios", []):
        missing += [s.get("name", "?") + "." + f for f in SCEN_FIELDS if f not in s]
        missing += [s.get("name", "?") + ".per_token." + f for f in PER_TOKEN if f not in s.get("per_token", {})]
        for o in s.get("ops", []):
            missing += [o.get("op", "?") + "." + f for f in OP_FIELDS if f not in o]
    kinds = [(s["kind"], s["depth"]) for s in js["scenarios"]]
    result("roofline_fields_" + tag, not missing and kinds == [("decode", 0), ("decode", depth), ("prefill", 0)]
           and [o["op"] for o in js["scenarios"][0]["ops"]] == OPS and js["kv_type"] == kv,
           "missing %s, scenarios %s" % (missing[:10], kinds))

    bad = []
    for s in js["scenarios"]:
        ops = s["ops"]
        tsum = sum(o["time_s"] for o in ops)
        if not near(tsum, s["ops_s"], 1e-4):
            bad.append("%s: op times %.9f, ops_s %.9f" % (s["name"], tsum, s["ops_s"]))
        if not (s["ops_s"] <= s["step_s"] * (1 + 1e-6) and s["ops_s"] >= (1 - OPS_MARGIN) * s["step_s"]):
            bad.append("%s: ops %.6f of step %.6f" % (s["name"], s["ops_s"], s["step_s"]))
        if not near(s["other_s"], s["step_s"] - s["ops_s"], 1e-3):
            bad.append("%s: other_s" % s["name"])
        for o in ops:
            if not near(o["kernel_s"] + o["gap_s"], o["time_s"], 1e-4) or o["gap_s"] < 0:
                bad.append("%s %s: kernel + gap != time" % (s["name"], o["op"]))
            if not near(o["bytes"], o["weight_bytes"] + o["kv_read_bytes"] + o["kv_write_bytes"] + o["act_bytes"], 1e-6):
                bad.append("%s %s: bytes" % (s["name"], o["op"]))
            if o["bound"] not in ("memory", "compute"):
                bad.append("%s %s: bound %s" % (s["name"], o["op"], o["bound"]))
    result("roofline_sums_" + tag, not bad, "; ".join(bad[:6]))

    # the recurrent state: per decode token, one sequence's state read and
    # written (STATE), counted in the linear-attention op, which has time;
    # nothing in that op without recurrent layers
    bad = []
    for s in js["scenarios"]:
        lin = [o for o in s["ops"] if o["op"] == "linear attention"][0]
        st = s["per_token"]["state_bytes"]
        want = STATE.get(preset, 0) if s["kind"] == "decode" else STATE.get(preset, 0) / s["tokens"]
        if not near(st, want, 1e-6):
            bad.append("%s: state %.1f per token, expected %.1f" % (s["name"], st, want))
        if STATE.get(preset):
            if not (lin["time_s"] > 0 and lin["act_bytes"] >= st * s["tokens"] / s["passes"] and lin["flops"] > 0
                    and lin["weight_bytes"] > 0):
                bad.append("%s: linear attention op %s" % (s["name"], lin))
        elif lin["bytes"] != 0 or lin["flops"] != 0:
            bad.append("%s: linear attention op without recurrent layers: %s" % (s["name"], lin))
    result("roofline_state_" + tag, not bad, "; ".join(bad[:4]))

    # KV bytes against the formula, per decode scenario
    b = KV_BYTES[kv]
    layers, kvh, hd, _, _ = PRESETS[preset]
    bad = []
    for s in js["scenarios"]:
        if s["kind"] != "decode":
            continue
        d = s["depth"]
        expect = sum(kv_read_formula(preset, d + 2 + i, b) for i in range(n_gen)) / n_gen
        pt = s["per_token"]
        if not near(pt["kv_read_bytes"], expect, 1e-6):
            bad.append("%s: read %.1f, formula %.1f" % (s["name"], pt["kv_read_bytes"], expect))
        if not near(pt["kv_read_global_bytes"] + pt["kv_read_local_bytes"], pt["kv_read_bytes"], 1e-6):
            bad.append("%s: classes" % s["name"])
        if not near(pt["kv_write_bytes"], rows(preset) * layers * kvh * hd * b, 1e-6):
            bad.append("%s: write %.1f" % (s["name"], pt["kv_write_bytes"]))
        att = [o for o in s["ops"] if o["op"] == "attention"][0]
        if not near(att["kv_read_bytes"], pt["kv_read_bytes"] * s["tokens"] / s["passes"], 1e-6):
            bad.append("%s: attention op" % s["name"])
        if s["batch"] != batch or s["tokens"] != n_gen * batch:
            bad.append("%s: batch %d tokens %d" % (s["name"], s["batch"], s["tokens"]))
        # a matrix is read once per pass: per token, 1/batch of one pass's
        qkv = [o for o in s["ops"] if o["op"] == "q/k/v matmul"][0]
        if not near(pt["weight_bytes"], sum(o["weight_bytes"] for o in s["ops"]) / batch, 1e-6) or \
                qkv["weight_bytes"] <= 0:
            bad.append("%s: weights per token" % s["name"])
    result("roofline_kv_formula_" + tag, not bad, "; ".join(bad))

    # pictures
    bad = []
    for s in js["scenarios"]:
        f = os.path.join(svg_dir, "roofline-%s.svg" % ("decode-b%d-d%d" % (batch, s["depth"]) if s["kind"] == "decode"
                                                      else "prefill-40"))
        try:
            root = ET.parse(f).getroot()
        except (OSError, ET.ParseError) as e:
            bad.append("%s: %s" % (f, e))
            continue
        pts = [c.get("data-op") for c in root.iter(SVG_NS + "circle") if c.get("class") == "op"]
        want = [o["op"] for o in s["ops"] if o["plotted"]]
        if pts != want or not want:
            bad.append("%s: points %s, plotted %s" % (s["name"], pts, want))
        if len([p for p in root.iter(SVG_NS + "polyline") if p.get("class") == "roof"]) != 1:
            bad.append("%s: no roof" % s["name"])
    try:
        root = ET.parse(os.path.join(svg_dir, "decode-time.svg")).getroot()
        texts = [t.text for t in root.iter(SVG_NS + "text")]
        for s in js["scenarios"]:
            if s["kind"] == "decode" and s["name"] not in texts:
                bad.append("no bar for " + s["name"])
        if not [r_ for r_ in root.iter(SVG_NS + "rect") if r_.get("class") == "part"]:
            bad.append("no bar parts")
    except (OSError, ET.ParseError) as e:
        bad.append("decode-time.svg: %s" % e)
    result("roofline_svg_" + tag, not bad, "; ".join(bad))


def check_sweep(preset, path):
    r = run(["bench", "-m", path, "-d", "0,64,200", "-p", "0", "-n", "2", "-r", "1", "--no-bw", "-t", "2",
             "-o", "json"])
    if r.returncode != 0:
        result("sweep_runs_" + preset, False, r.stderr[-2000:])
        return
    js = json.loads(r.stdout)
    sw = js.get("kv_sweep", {})
    bad = []
    for e in sw.get("depths", []):
        f = kv_read_formula(preset, e["depth"], 2.0)
        if not (near(e["kv_read_bytes"], f, 1e-9) and near(e["formula_bytes"], f, 1e-9)):
            bad.append("depth %d: counted %s, formula %s, expected %.0f" % (e["depth"], e["kv_read_bytes"],
                                                                             e["formula_bytes"], f))
    if [e["depth"] for e in sw.get("depths", [])] != [0, 64, 200]:
        bad.append("depths %s" % sw.get("depths"))
    tests = [t["test"] for t in js["tests"]]
    if tests != ["tg2", "tg2 @ d64", "tg2 @ d200"]:
        bad.append("tests %s" % tests)
    w = sw.get("weight_bytes_per_token", 0)
    cross = sw.get("kv_crossover_depth")
    limit = 1 << 22  # bench searches up to this depth
    if kv_read_formula(preset, limit, 2.0) < w:
        d = None
    else:
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi) // 2
            if kv_read_formula(preset, mid, 2.0) >= w:
                hi = mid
            else:
                lo = mid + 1
        d = lo
    if cross != d:
        bad.append("crossover %s, formula %s" % (cross, d))
    if sw.get("state_bytes_per_step", 0) != STATE.get(preset, 0):
        bad.append("state bytes %s, expected %s" % (sw.get("state_bytes_per_step"), STATE.get(preset, 0)))
    result("sweep_" + preset, not bad, "; ".join(bad))


FAKE_CONVERTER = """#!/bin/sh
# rsvg-convert -f png -o OUT IN, as the test's stand-in: writes a marker and the SVG's size
out=""; svg=""
while [ $# -gt 0 ]; do
  case "$1" in -o) out="$2"; shift 2;; -f) shift 2;; *) svg="$1"; shift;; esac
done
if [ "$FAKE_FAIL" = 1 ]; then printf 'PARTIAL' > "$out"; exit 1; fi
printf 'FAKEPNG %s' "$(wc -c < "$svg")" > "$out"
exit 0
"""


def check_png(path, tmp):
    """PNGs come through the output guard: written whole by the converter into a temporary file that
    replaces the PNG only when the converter succeeds; a failed conversion leaves the old PNG and no
    temporary behind."""
    bindir = os.path.join(tmp, "fakebin")
    os.makedirs(bindir, exist_ok=True)
    conv = os.path.join(bindir, "rsvg-convert")
    with open(conv, "w") as f:
        f.write(FAKE_CONVERTER)
    os.chmod(conv, 0o755)
    svg_dir = os.path.join(tmp, "png")
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    args = [LAMINA, "bench", "-m", path, "--roofline", "-d", "16", "-n", "2", "-p", "8", "-t", "2", "--svg", svg_dir]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    pngs = sorted(f for f in os.listdir(svg_dir) if f.endswith(".png")) if os.path.isdir(svg_dir) else []
    svgs = sorted(f for f in os.listdir(svg_dir) if f.endswith(".svg")) if os.path.isdir(svg_dir) else []
    first = open(os.path.join(svg_dir, pngs[0]), "rb").read() if pngs else b""
    result("roofline PNGs: one per SVG, written by the converter", r.returncode == 0 and pngs and
           [p[:-4] for p in pngs] == [s_[:-4] for s_ in svgs] and first.startswith(b"FAKEPNG "),
           "rc %d pngs %s svgs %s %r %s" % (r.returncode, pngs, svgs, first[:40], r.stderr[-300:]))
    env["FAKE_FAIL"] = "1"
    r = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    after = open(os.path.join(svg_dir, pngs[0]), "rb").read() if pngs else b""
    left = [f for f in os.listdir(svg_dir) if ".tmp-" in f]
    result("a failed conversion keeps the old PNG and leaves no temporary file",
           r.returncode == 0 and after == first and not left and "converter failed" in r.stderr,
           "rc %d left %s same %s %s" % (r.returncode, left, after == first, r.stderr[-300:]))


def main():
    tmp = tempfile.mkdtemp(prefix="lamina-roofline-")
    files = {}
    for p in PRESETS:
        path = os.path.join(tmp, p + ".gguf")
        r = run(["mkmodel", "-o", path, "--preset", p, "--type", "Q8_0" if p != "small" else "Q4_0", "-t", "2"])
        result("mkmodel_" + p, r.returncode == 0, r.stderr[-500:])
        files[p] = path
    for p in PRESETS:
        check_roofline(p, files[p], "F16" if p != "small" else "Q8_0", tmp)
        if ASAN:
            break
    if not ASAN:
        check_roofline("gemma2-small", files["gemma2-small"], "Q8_0", tmp, batch=3)  # copies under a window
        check_roofline("small", files["small"], "F16", tmp, batch=12)  # more sequences than a depth-0 pass has context
    for p in ("small", "gemma2-small", "deepseek2-small", "qwen35-small"):
        check_sweep(p, files[p])
    check_png(files["small"], tmp)
    for args, what in ((["--svg", tmp], "--svg without --roofline"), (["-d", "1,x"], "a bad depth list"),
                       (["--roofline", "-b", "0"], "batch 0")):
        r = run(["bench", "-m", files["small"], "-n", "1", "-p", "0"] + args)
        result("refused " + what, r.returncode == 2 and "lamina bench" in r.stderr, "rc %d %s" % (r.returncode,
                                                                                                   r.stderr[-300:]))
    return summary()


if __name__ == "__main__":
    sys.exit(main())
