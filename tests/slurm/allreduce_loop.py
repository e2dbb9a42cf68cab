"""A job that runs until it is stopped: every rank allreduces through mlsl_tf in a loop (scancel and node-failure tests).

Rank 0 prints one line when every rank has joined, then a line every 20 steps; output is unbuffered.
"""

import socket
import sys
import time

import numpy as np

import mlsl_tf as hvd

hvd.init()
ones = np.ones(1024, np.float32)
step = 0
while True:
    total = hvd.allreduce(ones, op=hvd.Sum, name="allreduce_loop").numpy()
    if step == 0:
        print(f"rank {hvd.rank()} of {hvd.size()} on {socket.gethostname()}: the ranks are running", flush=True)
    if hvd.rank() == 0 and step % 20 == 0:
        print(f"step {step}: sum {total[0]:.0f}", flush=True)
    step += 1
    time.sleep(0.05)
    sys.stdout.flush()
