#!/usr/bin/env python3
"""tp_scale_model.py - the paper model of tensor-parallel decode across hosts
(bench/results/parallel.md, "Tensor parallelism over MPI"): expected tokens/s of one
sequence's decode for a model shape on N hosts joined by an Ethernet link.

Per token, with tensor parallelism over N hosts (one rank per host):

  t(N) = t_compute / N                        every rank streams 1/N of the weights
       + 2 L * t_allreduce(4 E bytes)         after o and after down, each layer
       + t_allgather(4 V / N bytes per rank)  the LM head's vocabulary slices

  t_allreduce(S) = 2 (N-1) a + 2 (N-1)/N * S / B     (ring: reduce-scatter + all-gather)
  t_allgather(S) =   (N-1) a +   (N-1)   * S / B

a is the per-step latency of a message, B the link's bandwidth. t_compute is
one host's decode time per token: weight bytes / the decode bandwidth lamina
reaches (measured on this machine: TinyLlama-1.1B shape Q4_0, 590 MiB, at 15.0
tokens/s on 2 threads when the machine was quiet: 8.8 GB/s).

Usage: python3 bench/tp_scale_model.py   (prints the markdown table)
"""
GBPS = 8.8e9  # bytes/s of weights one host streams while decoding (measured, see above)
SHAPES = [  # name, layers, n_embd, vocab, Q4_0 weight bytes
    ("TinyLlama-1.1B", 22, 2048, 32000, 619.1e6),
    ("7B (Llama-2 shape)", 32, 4096, 32000, 3.83e9),
    ("70B (Llama-2 shape)", 80, 8192, 32000, 38.9e9),
]
LINKS = [("25 GbE", 25e9 / 8, 20e-6), ("100 GbE", 100e9 / 8, 10e-6)]  # name, bytes/s, latency per step


def per_token(L, E, V, wbytes, n, bw, a):
    comp = wbytes / GBPS / n
    if n == 1:
        return comp, 0.0
    ar = 2 * (n - 1) * a + 2 * (n - 1) / n * 4 * E / bw
    ag = (n - 1) * a + (n - 1) * 4 * V / n / bw
    return comp, 2 * L * ar + ag


def main():
    print("| model (Q4_0) | 1 host t/s | link | 2 hosts t/s (comm %) | 4 hosts t/s (comm %) | 8 hosts t/s (comm %) |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    for name, L, E, V, wb in SHAPES:
        one = 1 / per_token(L, E, V, wb, 1, 1, 0)[0]
        for lname, bw, a in LINKS:
            cells = []
            for n in (2, 4, 8):
                c, m = per_token(L, E, V, wb, n, bw, a)
                cells.append("%.1f (%.0f%%)" % (1 / (c + m), 100 * m / (c + m)))
            print("| %s | %.2f | %s | %s |" % (name, one, lname, " | ".join(cells)))


if __name__ == "__main__":
    main()
