"""OpenBLAS threads spinning after a BLAS call: 20 dot products of 20,000 elements (what
`LogHistogram.add_many` did at each ITL flush), each followed by pure-Python work (what a simulation
does), with the default thread pool and with one thread (benchmarks/results/engine_boundaries.md).

    python benchmarks/blas_spin.py; OPENBLAS_NUM_THREADS=1 python benchmarks/blas_spin.py
"""

import os
import resource
import time

import numpy as np


def main() -> None:
    values = np.random.default_rng(0).random(20000)
    counts = np.arange(20000, dtype=np.int64)
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(20):
        float(values @ counts)
        x = 0
        for i in range(200000):
            x += i
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'default')}: "
          f"wall {wall:.2f} s, CPU {cpu:.2f} s, CPU/wall {cpu / wall:.2f}")


if __name__ == "__main__":
    main()
