"""The simulator runs the core's engine (ops/core/sim/): for a fixed set of allreduces -- small
ones that ride in the control message or are fused, big ones cut into chunks that more urgent
ones overtake, submitted in an order unlike their priorities -- the order in which they complete
in a real job of these ranks (read from the timeline rank 0 writes) is the one the simulator
predicts for the same ranks (one host: shared memory, rates of the order of this machine's).

TensorFlow's executor hands the requests to the background thread a few microseconds apart, in
an order of its own, so they may reach the engine in several cycles; which of them complete
first can depend on that (a small request that arrives before an urgent big one finishes first).
The test therefore asks the simulator for the order under three submission patterns (all at
once; one every 50 us in the listed order; the reverse) and compares the real job on the pairs
all three agree on -- and checks that these are most of them, so the set was chosen well: every
request less urgent than another is bigger than the in-flight window (4 chunks of 1 MiB), so
however many of its chunks start early, the rest waits behind the urgent one."""

import json
import os
import shutil
import subprocess
import tempfile

import numpy as np
import tensorflow as tf
from mpi4py import MPI

import mlsl_tf as hvd
from mlsl_tf import simulate, timeline

MIB = 1 << 20
# name -> (bytes of float32, priority), in the order the graph lists them
REQUESTS = {"A": (16 * MIB, 9), "e1": (1024, 0), "D": (6 * MIB, 6), "B": (8 * MIB, 4), "f2": (128 << 10, 0),
            "f1": (64 << 10, 0), "e2": (2048, 0), "C": (5 * MIB, 1)}
ROUNDS = 3


def simulated(pattern):
    """{name: completion time} of the simulator's last round (names negotiated and cached)."""
    n, names = hvd.size(), list(REQUESTS)
    at = {"at_once": lambda i: 0.0, "listed": lambda i: 50e-6 * i, "reversed": lambda i: 50e-6 * (len(names) - 1 - i)}
    text = "\n".join([f"ranks {n}", f"ranks_per_host {n}", "alpha_shm 20e-6", "beta_shm 1e-9", f"rounds {ROUNDS}"]
                     + [f"request {k} {REQUESTS[k][0]} {REQUESTS[k][1]} {at[pattern](i)}"
                        for i, k in enumerate(names)]) + "\n"
    out = subprocess.run([simulate.find_binary(), "--requests"], input=text, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    done = [json.loads(line) for line in out.stdout.splitlines()]
    return {d["name"]: d["done_s"] for d in done if d["round"] == ROUNDS - 1}


def before(order):
    return {(x, y) for x in order for y in order if order[x] < order[y]}


@tf.function
def one_round():
    return [hvd.allreduce(tf.fill([b // 4], float(hvd.rank() + 1)), op=hvd.Sum, name=f"sim_order.{name}", priority=p)
            for name, (b, p) in REQUESTS.items()]


def test_real_job_completes_in_the_simulated_order():
    patterns = {p: simulated(p) for p in ("at_once", "listed", "reversed")}
    robust = set.intersection(*(before(o) for o in patterns.values()))
    small, big = ["e1", "e2", "f1", "f2"], ["C", "B", "D", "A"]  # big: in order of urgency
    wanted = {(s, b) for s in small for b in big} | {(x, y) for i, x in enumerate(big) for y in big[i + 1:]}
    assert wanted <= robust, f"the simulated order depends on the submission pattern: {patterns}"

    path = MPI.COMM_WORLD.bcast(tempfile.mkdtemp(prefix="mlsl-order-") if hvd.rank() == 0 else None, root=0)
    trace = os.path.join(path, "order.json")
    hvd.start_timeline(trace)  # rank 0 writes it: when the core finished each request
    for _ in range(ROUNDS):  # the last round as the simulator's
        sums = one_round()
    hvd.stop_timeline()
    n = hvd.size()
    for name, s in zip(REQUESTS, sums):
        assert np.all(s.numpy() == n * (n + 1) / 2), name
    if hvd.rank() == 0:
        real = {}
        for i in timeline.load(trace).instants:  # later rounds overwrite earlier ones
            if i.kind in ("done", "eager") and i.name.startswith("sim_order."):
                real[i.name[len("sim_order."):]] = i.at_us
        shutil.rmtree(path, ignore_errors=True)
        assert set(real) == set(REQUESTS), real
        wrong = sorted(robust - before(real))
        assert not wrong, (f"completed {sorted(real, key=real.get)}, simulated "
                           f"{ {p: sorted(o, key=o.get) for p, o in patterns.items()} }: "
                           f"{', '.join(f'{x} before {y}' for x, y in wrong)} not so in the real job")
        # not trivially the order the graph lists them in
        assert any(names.index(x) > names.index(y) for x, y in robust for names in [list(REQUESTS)])
    MPI.COMM_WORLD.Barrier()
