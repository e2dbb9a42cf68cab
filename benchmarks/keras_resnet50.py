"""Synthetic ResNet-50 training throughput (examples/resnet50_synthetic.py) on 1 and 2 ranks:
mlsl_tf, and Horovod when a venv with it is given. One JSON line per run, one summary line per
(framework, ranks) with the median over runs and the scaling efficiency, and a PNG plot.

    python benchmarks/keras_resnet50.py [--ranks 1,2] [--runs 3] [--image-size 64] [--use-fit]
        [--horovod-python /path/to/hvd-venv/bin/python] [--plot build/keras_resnet50.png]

Each run is its own `mpiexec -n N` job (the mpiexec next to the interpreter); runs of the
different configurations are interleaved so that load from other processes spreads over all of
them. Throughput is the example's total img/sec (each iteration's per-rank rates summed over
ranks, averaged over iterations); scaling efficiency = median total(N) / (N * median total(1)).
Horovod (TensorFlow <= 2.15 only) runs the same script with --framework horovod under its own
venv's mpiexec; without that venv it is reported as skipped, with the reason.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netlink  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "resnet50_synthetic.py")
LAUNCHER_ENV = ("PMI_", "PMIX_", "HYD", "MPI_LOCAL", "OMPI_")  # what a nested mpiexec must not inherit


def horovod_problem(python):
    """None when `python` can run Horovod's TensorFlow API with an mpiexec, else why not."""
    if not python:
        return "no Horovod venv given (--horovod-python or $HOROVOD_PYTHON); Horovod 0.28.1 does not build " \
               "against TensorFlow 2.21, see benchmarks/README.md for the TensorFlow 2.15 venv"
    if not os.access(python, os.X_OK):
        return f"{python} is not an executable interpreter"
    if not netlink.mpiexec_next_to(python):
        return f"no mpiexec next to {python} or on PATH"
    probe = subprocess.run([python, "-c", "import horovod.tensorflow"], capture_output=True, text=True,
                           env=clean_env(with_repo=False), timeout=300)
    if probe.returncode != 0:
        tail = (probe.stderr.strip().splitlines() or ["exit %d" % probe.returncode])[-1]
        return f"{python} cannot import horovod.tensorflow: {tail}"
    return None


def clean_env(with_repo):
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_ENV)}
    env.pop("PYTHONPATH", None)
    if with_repo:
        env["PYTHONPATH"] = ROOT
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def one_run(framework, python, nranks, example_args, timeout):
    """Runs the example once; returns its JSON result (dict) or raises RuntimeError."""
    cmd = [netlink.mpiexec_next_to(python), "-n", str(nranks), python, EXAMPLE, "--json", "--framework", framework]
    cmd += example_args
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=clean_env(with_repo=framework == "mlsl_tf"))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {timeout} s: {' '.join(cmd)}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not rows:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(cmd)}: " + " | ".join(tail))
    result = rows[-1]
    result["wall_s"] = time.perf_counter() - start
    return result


def summarize(framework, totals):
    """{ranks: [total img/sec per run]} -> summary rows with medians and scaling efficiency."""
    base = statistics.median(totals[min(totals)]) / min(totals) if totals else None
    out = []
    for n in sorted(totals):
        med = statistics.median(totals[n])
        out.append({"summary": True, "framework": framework, "ranks": n, "runs": len(totals[n]),
                    "median_total_img_sec": med, "median_img_sec_per_rank": med / n,
                    "min_total_img_sec": min(totals[n]), "max_total_img_sec": max(totals[n]),
                    "scaling_efficiency": med / (n * base) if base else None})
    return out


def plot(summaries, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_tot, ax_eff) = plt.subplots(1, 2, figsize=(10, 4))
    for fw in sorted({s["framework"] for s in summaries}):
        rows = [s for s in summaries if s["framework"] == fw]
        ranks = [s["ranks"] for s in rows]
        ax_tot.errorbar(ranks, [s["median_total_img_sec"] for s in rows], marker="o", capsize=4, label=fw,
                        yerr=[[s["median_total_img_sec"] - s["min_total_img_sec"] for s in rows],
                              [s["max_total_img_sec"] - s["median_total_img_sec"] for s in rows]])
        ax_eff.plot(ranks, [s["scaling_efficiency"] for s in rows], marker="o", label=fw)
    ax_tot.set(xlabel="ranks", ylabel="total images/sec (median, min-max bars)")
    ax_eff.set(xlabel="ranks", ylabel="scaling efficiency", ylim=(0, 1.3))
    for ax in (ax_tot, ax_eff):
        ax.set_xticks(sorted({s["ranks"] for s in summaries}))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2],
                   help="comma-separated rank counts (the smallest is the scaling baseline)")
    p.add_argument("--runs", type=int, default=3, help="runs per configuration (medians are reported)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16, help="images per rank per step")
    p.add_argument("--num-warmup-batches", type=int, default=2)
    p.add_argument("--num-batches-per-iter", type=int, default=3)
    p.add_argument("--num-iters", type=int, default=3)
    p.add_argument("--use-fit", action="store_true", help="model.fit + DistributedOptimizer instead of the tape loop")
    p.add_argument("--fp16-allreduce", action="store_true")
    p.add_argument("--horovod-python", default=os.environ.get("HOROVOD_PYTHON"),
                   help="interpreter of a venv with Horovod and mpiexec next to it (default $HOROVOD_PYTHON)")
    p.add_argument("--plot", default=os.path.join(ROOT, "build", "keras_resnet50.png"), help="PNG path")
    p.add_argument("--timeout", type=int, default=300, help="seconds one run may take")
    ns = p.parse_args(argv)
    if not ns.ranks or any(n < 1 for n in ns.ranks):
        p.error("--ranks must be positive integers")
    if ns.runs < 1:
        p.error("--runs must be >= 1")
    return ns


def main(argv=None):
    ns = parse(sys.argv[1:] if argv is None else argv)
    if any(k in os.environ for k in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE")):
        sys.exit("keras_resnet50.py starts its own mpiexec jobs: run it without mpiexec")
    example_args = ["--image-size", str(ns.image_size), "--batch-size", str(ns.batch_size),
                    "--num-warmup-batches", str(ns.num_warmup_batches),
                    "--num-batches-per-iter", str(ns.num_batches_per_iter), "--num-iters", str(ns.num_iters)]
    example_args += ["--use-fit"] * ns.use_fit + ["--fp16-allreduce"] * ns.fp16_allreduce

    frameworks = {"mlsl_tf": sys.executable}
    problem = horovod_problem(ns.horovod_python)
    if problem:
        print(json.dumps({"framework": "horovod", "skipped": True, "reason": problem}), flush=True)
    else:
        frameworks["horovod"] = ns.horovod_python

    totals = {fw: {n: [] for n in ns.ranks} for fw in frameworks}
    failed = False
    for run in range(ns.runs):
        for fw, python in frameworks.items():
            for n in ns.ranks:
                try:
                    r = one_run(fw, python, n, example_args, ns.timeout)
                except RuntimeError as e:
                    print(json.dumps({"framework": fw, "ranks": n, "run": run, "error": str(e)}), flush=True)
                    failed = True
                    continue
                totals[fw][n].append(r["total_img_sec_mean"])
                print(json.dumps({"framework": fw, "ranks": n, "run": run, "total_img_sec": r["total_img_sec_mean"],
                                  "total_img_sec_conf": r["total_img_sec_conf"], "mode": r["mode"],
                                  "image_size": r["image_size"], "batch_size": r["batch_size"],
                                  "wall_s": round(r["wall_s"], 1)}), flush=True)

    summaries = []
    for fw in frameworks:
        summaries += summarize(fw, {n: t for n, t in totals[fw].items() if t})
    if "horovod" in frameworks:
        hvd_med = {s["ranks"]: s["median_total_img_sec"] for s in summaries if s["framework"] == "horovod"}
        for s in summaries:
            if s["framework"] == "mlsl_tf" and s["ranks"] in hvd_med:
                s["ratio_vs_horovod"] = s["median_total_img_sec"] / hvd_med[s["ranks"]]
    for s in summaries:
        print(json.dumps(s), flush=True)
    if summaries and ns.plot:
        plot(summaries, ns.plot, f"synthetic {ns.image_size}x{ns.image_size} ResNet-50, batch {ns.batch_size}/rank, "
             f"{'fit' if ns.use_fit else 'tape'}, median of {ns.runs}")
        print(json.dumps({"plot": ns.plot}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
