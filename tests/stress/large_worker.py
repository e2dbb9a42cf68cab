"""One rank of the large-input checks (run by test_large.py under mlslrun): a broadcast of more
than 2^31-1 elements, and the peak memory of a 512 MiB allreduce. Prints JSON lines."""

import json
import resource
import sys

import mlsl_tf as hvd

hvd.init()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

N, R = hvd.size(), hvd.rank()
what = sys.argv[1]


def peak_kib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


if what == "allreduce":
    n = 512 * 1024 * 1024 // 4
    x = tf.fill([n], float(R + 1))
    base = peak_kib()
    y = hvd.allreduce(x, op=hvd.Sum, name="big_allreduce")
    ok = bool(tf.reduce_all(tf.equal(y, float(N * (N + 1) / 2))).numpy())
    del y
    print("LARGE " + json.dumps({"rank": R, "what": what, "ok": ok, "tensor_mib": 512,
                                 "peak_before_mib": base // 1024, "peak_mib": peak_kib() // 1024,
                                 "extra_over_input": round((peak_kib() - base) / (512 * 1024), 2)}), flush=True)
else:
    n = (1 << 31) + 8  # elements, uint8
    pattern = np.arange(251, dtype=np.uint8)
    if R == N - 1:
        x = tf.constant(np.resize(pattern, n))
    else:
        x = tf.zeros([n], tf.uint8)
    y = hvd.broadcast(x, root_rank=N - 1, name="huge_broadcast").numpy()
    del x
    ok = y.shape == (n,)
    step = 1 << 26
    for at in range(0, n, step):  # compare in pieces: a full-size boolean would be 2 GiB
        piece = y[at:at + step]
        ok = ok and np.array_equal(piece, pattern[(np.arange(piece.size) + at) % 251])
    print("LARGE " + json.dumps({"rank": R, "what": what, "ok": bool(ok), "elements": n,
                                 "peak_mib": peak_kib() // 1024}), flush=True)
