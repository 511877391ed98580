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
