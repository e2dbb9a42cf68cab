"""Puts the simulator against published scaling efficiencies: Intel MLSL's (the seed paper:
Sridharan et al., "On Scale-out Deep Learning Training for Cloud and HPC", SysML 2018 -- ResNet-50
on Xeon Gold 6148 nodes over Omni-Path) and Horovod's (Sergeev & Del Balso 2018 -- Inception V3,
ResNet-101, VGG-16 on 128 servers of 4 Pascal GPUs, 25 Gbit/s RoCE); then predicts mlsl_tf's
policies on those clusters.

    python benchmarks/published_scale.py [--steps 60] [--seeds 1,2,3] [--variance measured]
        [--out benchmarks/results/published_scale.jsonl] [--png benchmarks/results/published_scale.png]
    python benchmarks/published_scale.py --fast            # a few steps, one seed (tests)
    python benchmarks/published_scale.py --measure-variance  # re-measure sim_models/step_variance.json

Each cluster is a parameter file, mlsl_tf/sim_models/cluster_*.json: the link, its latency, ranks
per host, the allreduce algorithm, each model's per-rank images/s and batch (from the papers and
the hardware; each file says where each figure comes from and which are assumptions), the
published figures, and the policy of the simulator nearest to the published system. Every row
of a cluster is simulated with the same parameters and with the step-time variance measured on
this machine (sim_models/step_variance.json): nothing is fitted per row.

Output, one JSON line per published figure: source, model, nodes, published, predicted
(efficiencies as fractions: nominal compute / simulated step, i.e. throughput over N times one
rank's), predicted_no_variance (the same simulation with --variance 0: what the network and
the engine alone cost), slowest_factor (the slowest rank's mean compute factor), miss_points
(predicted - published, in points) and within_5_points; then one line per (published figure's
cluster, model and nodes) x mlsl_tf policy with source "mlsl_tf prediction" and published null.
Each prediction is the mean over --seeds of a --steps simulation (2 of them warm-up).
"""

import argparse
import json
import math
import os
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from mlsl_tf import simulate  # noqa: E402

CLUSTERS = ("cluster_mlsl_2018", "cluster_horovod_2018")
MLSL_TF_POLICIES = ("fifo", "priority", "overlap", "bf16")


def load_cluster(name):
    path = pathlib.Path(name) if name.endswith(".json") else simulate.MODELS / f"{name}.json"
    return json.loads(path.read_text())


def simulate_point(cluster, model, nodes, policy, variance, steps, seeds, binary=None):
    """Mean over seeds of one simulated configuration: efficiency, step_s, slowest_factor."""
    spec = cluster["models"][model]
    layers = simulate.timed_layers(simulate.load_table(model), spec["batch"] / spec["images_per_s"])
    runs = []
    for seed in seeds:
        text = simulate.config_text(layers, nodes, simulate.parse_rate(cluster["link"]),
                                    simulate.parse_seconds(cluster["latency"]), policy,
                                    ranks_per_host=cluster.get("ranks_per_host", 1),
                                    allreduce=cluster.get("allreduce", "auto"), steps=steps,
                                    variance=variance, seed=seed, hierarchical=cluster.get("hierarchical", True),
                                    latency_shm=(simulate.parse_seconds(cluster["latency_shm"])
                                                 if "latency_shm" in cluster else None))
        runs.append(simulate.run_config(text, binary))
    mean = lambda key: statistics.fmean(r[key] for r in runs)  # noqa: E731
    return {"efficiency": mean("efficiency"), "step_s": mean("step_s"), "compute_s": runs[0]["compute_s"],
            "slowest_factor": mean("slowest_factor"), "link_busy_s": mean("link_busy_s"),
            "grad_bytes": runs[0]["grad_bytes"]}


def published_rows(clusters, variance, steps, seeds, binary=None):
    rows = []
    for cluster in clusters:
        for fig in cluster["figures"]:
            on = simulate_point(cluster, fig["model"], fig["nodes"], cluster["policy"], variance, steps, seeds, binary)
            off = simulate_point(cluster, fig["model"], fig["nodes"], cluster["policy"], 0.0, steps, [1], binary)
            miss = 100 * (on["efficiency"] - fig["published"])
            rows.append({"source": cluster["source"], "cluster": cluster["cluster"], "model": fig["model"],
                         "nodes": fig["nodes"], "published": fig["published"],
                         "predicted": round(on["efficiency"], 4),
                         "predicted_no_variance": round(off["efficiency"], 4),
                         "miss_points": round(miss, 1), "within_5_points": abs(miss) <= 5,
                         "policy": cluster["policy"], "slowest_factor": round(on["slowest_factor"], 4),
                         "step_s": round(on["step_s"], 4), "compute_s": round(on["compute_s"], 4),
                         "link_busy_s": round(on["link_busy_s"], 4), "grad_bytes": on["grad_bytes"],
                         "variance": variance, "steps": steps, "seeds": list(seeds), "what": fig["what"]})
    return rows


def policy_rows(clusters, variance, steps, seeds, policies=MLSL_TF_POLICIES, binary=None):
    rows = []
    for cluster in clusters:
        for fig in cluster["figures"]:
            for policy in policies:
                r = simulate_point(dict(cluster, **cluster.get("mlsl_tf", {})), fig["model"], fig["nodes"], policy,
                                   variance, steps, seeds, binary)
                mpi = cluster.get("mlsl_tf", {})
                rows.append({"source": "mlsl_tf prediction", "cluster": cluster["cluster"], "model": fig["model"],
                             "nodes": fig["nodes"], "published": None, "predicted": round(r["efficiency"], 4),
                             "policy": policy, "allreduce": mpi.get("allreduce", cluster.get("allreduce", "auto")),
                             "hierarchical": mpi.get("hierarchical", cluster.get("hierarchical", True)), "slowest_factor": round(r["slowest_factor"], 4),
                             "step_s": round(r["step_s"], 4), "link_busy_s": round(r["link_busy_s"], 4),
                             "variance": variance, "steps": steps, "seeds": list(seeds)})
    return rows


def plot(rows, path):
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    figures = [r for r in rows if r["published"] is not None]
    policies = list(dict.fromkeys(r["policy"] for r in rows if r["published"] is None))
    series = [("published", "k", lambda f: f["published"]),
              ("predicted (the paper's system)", "tab:blue", lambda f: f["predicted"]),
              ("same, no variance", "tab:gray", lambda f: f["predicted_no_variance"])]
    colors = {"fifo": "tab:orange", "priority": "tab:green", "overlap": "tab:red", "bf16": "tab:purple"}
    for p in policies:
        series.append((f"mlsl_tf {p}", colors.get(p, None),
                       lambda f, p=p: next(r["predicted"] for r in rows if r["published"] is None and r["policy"] == p
                                           and (r["cluster"], r["model"], r["nodes"]) ==
                                           (f["cluster"], f["model"], f["nodes"]))))
    fig, ax = plt.subplots(figsize=(10, 5.4))
    width = 0.8 / len(series)
    for k, (label, color, value) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(figures))]
        ax.bar(xs, [100 * value(f) for f in figures], width, label=label, color=color,
               alpha=1.0 if k < 2 else 0.75)
    ax.set_xticks(range(len(figures)))
    ax.set_xticklabels([f"{f['source']}\n{f['model']}, {f['nodes']} {'GPUs' if 'horovod' in f['cluster'] else 'nodes'}"
                        for f in figures], fontsize=8)
    ax.set_ylim(50, 102)
    ax.set_ylabel("scaling efficiency (%)")
    sigma = figures[0]["variance"] if figures else 0
    ax.set_title(f"Published vs simulated (step-time variance sigma={sigma:.3f} measured here; "
                 f"{figures[0]['steps'] if figures else 0} steps x {len(figures[0]['seeds']) if figures else 0} seeds)",
                 fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure_variance(steps=60, warmup=5, series=3, path=simulate.VARIANCE_FILE):
    """Per-step times of benchmarks/training.py's compute configuration (ResNet-50, batch 16, one
    process, no reduction), `series` series of `steps` after `warmup`; returns them. The estimate
    written to sim_models/step_variance.json: the median over the series of the robust spread of
    the step-to-step changes of ln(step time) (see the file's 'estimator'); every series' other
    estimates are kept beside it."""
    sys.path.insert(0, str(HERE))
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    import training  # noqa: PLC0415
    keras.utils.set_random_seed(1234)
    model, x, y, loss = training.build_model("resnet50", keras, 16, seed=0)
    data = tf.data.Dataset.from_tensors((x, y)).repeat()
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss=loss)
    load = os.getloadavg()[0]
    model.fit(data, steps_per_epoch=warmup, epochs=1, verbose=0)
    runs = []
    for _ in range(series):
        ends = []
        clock = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: ends.append(time.perf_counter()))
        start = time.perf_counter()
        model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[clock])
        runs.append([round(b - a, 6) for a, b in zip([start] + ends[:-1], ends)])
    estimates = [variance_estimates(t) for t in runs]
    record = json.loads(pathlib.Path(path).read_text()) if pathlib.Path(path).exists() else {}
    record.pop("step_s", None)
    record.pop("other_estimates", None)
    record.update(sigma=round(statistics.median(e["robust_successive_difference_ln"] for e in estimates), 4),
                  estimates_per_series=estimates, mean_step_s=round(statistics.fmean(sum(runs, [])), 4),
                  median_step_s=round(statistics.median(sum(runs, [])), 4), step_s_per_series=runs,
                  measured=f"{time.strftime('%Y-%m-%d')}, benchmarks/published_scale.py --measure-variance: "
                  f"{warmup} warm-up steps, then {series} series of {steps} timed steps (load average before: {load:.1f})")
    pathlib.Path(path).write_text(json.dumps(record, indent=1) + "\n")
    return runs


def variance_estimates(times):
    """Estimates of the spread of ln(step time) of one series."""
    logs = [math.log(t) for t in times]
    diffs = [b - a for a, b in zip(logs, logs[1:])]

    def mad(v):
        m = statistics.median(v)
        return statistics.median(abs(x - m) for x in v)

    return {"robust_successive_difference_ln": round(1.4826 * mad(diffs) / math.sqrt(2), 4),
            "sd_ln_all_steps": round(statistics.pstdev(logs), 4),
            "cv_all_steps": round(statistics.pstdev(times) / statistics.fmean(times), 4),
            "mad_ln_all_steps": round(1.4826 * mad(logs), 4),
            "successive_difference_rms_ln": round(math.sqrt(sum(d * d for d in diffs) / len(diffs) / 2), 4),
            "sd_ln_last_30_steps": round(statistics.pstdev(logs[-30:]), 4)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clusters", default=",".join(CLUSTERS),
                   help="cluster parameter files (sim_models/NAME.json or paths) (default: %(default)s)")
    p.add_argument("--variance", default="measured",
                   help="sigma of ln(step compute), or 'measured' (sim_models/step_variance.json) (default: %(default)s)")
    p.add_argument("--steps", type=int, default=60, help="simulated steps per run, 2 of them warm-up (default: %(default)s)")
    p.add_argument("--seeds", default="1,2,3", help="seeds of the variance's draws, averaged (default: %(default)s)")
    p.add_argument("--policies", default=",".join(MLSL_TF_POLICIES),
                   help="mlsl_tf policies to predict on the clusters; '' for none (default: %(default)s)")
    p.add_argument("--fast", action="store_true", help="8 steps, one seed, one policy (overlap): for tests (default: off)")
    p.add_argument("--out", help="also write the JSON lines to this file (default: none)")
    p.add_argument("--png", help="draw published vs predicted into this PNG (default: none)")
    p.add_argument("--measure-variance", action="store_true",
                   help="measure this machine's step-time spread into sim_models/step_variance.json and exit "
                   "(about two minutes, on a machine with nothing else running; default: off)")
    a = p.parse_args(argv)
    if a.measure_variance:
        for times in measure_variance():
            print(json.dumps({"steps": len(times), **variance_estimates(times)}))
        print(json.dumps({"sigma": simulate.measured_variance()}))
        return 0
    variance = simulate.parse_variance(a.variance)
    seeds = [int(s) for s in a.seeds.split(",")]
    policies = [q for q in a.policies.split(",") if q]
    steps = a.steps
    if a.fast:
        steps, seeds, policies = 8, seeds[:1], ["overlap"]
    clusters = [load_cluster(c) for c in a.clusters.split(",")]
    binary = simulate.find_binary()
    rows = published_rows(clusters, variance, steps, seeds, binary)
    rows += policy_rows(clusters, variance, steps, seeds, policies, binary)
    lines = [json.dumps(r) for r in rows]
    print("\n".join(lines), flush=True)
    if a.out:
        pathlib.Path(a.out).write_text("\n".join(lines) + "\n")
    if a.png:
        plot(rows, a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
