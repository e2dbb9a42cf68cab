"""Predicts data-parallel training at 8-1024 nodes: runs mlsl_sim (the core's own engine --
cycle, negotiation, eager path, scheduler -- stepped on a virtual clock over an alpha-beta model
of MPICH's collectives; built by `make sim`, shipped in the installed package) per node count and policy, prints JSON lines, draws efficiency vs nodes.

    python -m mlsl_tf.simulate --model resnet50 --nodes 8,64,256,1024 --link 100gbit --latency 1us \\
        --batch 64 --images-per-s 100 --png sim.png

Step-time variance (on by default, --variance measured): each rank's compute of a step is its
nominal time times a lognormal factor of mean 1 whose log has the standard deviation measured
on this machine (sim_models/step_variance.json; --variance 0 for none); a synchronous step goes
at the pace of the slowest of the N ranks, so efficiency falls with N as the expected largest of
N draws grows (about sigma sqrt(2 ln N)). benchmarks/published_scale.py compares the predictions
with the published efficiencies of Intel MLSL and Horovod.

A model is a table (mlsl_tf/sim_models/NAME.json, or a path): per layer in forward order its
gradient tensors' float32 bytes and either its forward FLOPs per image (times are then the
per-step compute, --batch / --images-per-s or --step-compute, split in proportion to FLOPs,
backward = --bwd-ratio x forward) or its own fwd_s / bwd_s (a table measured elsewhere).
`keras_table` makes a table from a keras.applications model (no weights are downloaded).

Policies (what each idea buys is the difference between neighbours):
  horovod   FIFO, no cross-iteration overlap, Horovod's 64 MiB fusion, no chunking, one
            collective in flight, a 1 ms cycle (HOROVOD_CYCLE_TIME's default), no small
            allreduces riding in the control message
  fifo      mlsl_tf's scheduler with MLSL_TF_PRIORITY=fifo, MLSL_TF_CROSS_ITERATION=0
  priority  priority order with preemption between 1 MiB chunks, no cross-iteration overlap
  overlap   priority + cross-iteration overlap: mlsl_tf's default
  bf16      overlap + bfloat16 on the wire (the real wire path: all-to-all + allgather)
Needs none of the TensorFlow ops; TensorFlow only for keras_table / --measure.
"""

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
MODELS = HERE / "sim_models"
POLICIES = {
    "horovod": {"fifo": 1, "cross_iteration": 0, "fusion_threshold": 64 << 20, "chunk_bytes": (1 << 31) - 1,
                "inflight": 1, "cycle_s": 1e-3, "eager_bytes": 0},
    "fifo": {"fifo": 1, "cross_iteration": 0},
    "priority": {"fifo": 0, "cross_iteration": 0},
    "overlap": {"fifo": 0, "cross_iteration": 1},
    "bf16": {"fifo": 0, "cross_iteration": 1, "bf16": 1},
}
# mlsl_tf's defaults (ops/core/settings.cc): MLSL_TF_CHUNK_BYTES, MLSL_TF_INFLIGHT, MLSL_TF_FUSION_THRESHOLD.
DEFAULTS = {"chunk_bytes": 1 << 20, "inflight": 4, "fusion_threshold": 1 << 20, "cycle_s": 0.0, "bf16": 0,
            "interference": 0.0, "contention": 0.0}
# Memory-bound layers (batch norm, activations, adds, pooling) cost this many FLOP-equivalents
# per output element: about a tenth of ResNet-50's time on a CPU, as oneDNN profiles show.
ELEMENTWISE_FLOPS = 30


def parse_rate(text):
    """'100gbit', '10Gbit', '1.5gbit', '800mbit', '12.5GB' (bytes) -> bytes per second."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[-+]?[0-9]+)?)\s*([kmgt]?)(bit|b|bps|B)?\s*", str(text), re.I)
    if not m:
        raise ValueError(f"not a rate: {text!r}")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    unit = m.group(3) or "bit"
    return value if unit == "B" else value / 8


def parse_seconds(text):
    """'1us', '2.5ms', '0.3', '800ns' -> seconds."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[-+]?[0-9]+)?)\s*(ns|us|ms|s)?\s*", str(text))
    if not m:
        raise ValueError(f"not a time: {text!r}")
    return float(m.group(1)) * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1, None: 1}[m.group(2)]


# Files in sim_models that are parameters, not model tables.
PARAMETER_FILES = ("step_variance", "cluster_")
VARIANCE_FILE = MODELS / "step_variance.json"


def known_models():
    return sorted(p.stem for p in MODELS.glob("*.json") if not p.stem.startswith(PARAMETER_FILES))


def measured_variance(path=VARIANCE_FILE):
    """sigma of ln(step compute) measured on this machine (sim_models/step_variance.json says how)."""
    return float(json.loads(pathlib.Path(path).read_text())["sigma"])


def parse_variance(text):
    """'measured' (sim_models/step_variance.json's sigma) or a number >= 0 (sigma of ln step time)."""
    if str(text).strip() == "measured":
        return measured_variance()
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0:
        raise ValueError(f"a variance is 'measured' or a number >= 0, not {text!r}")
    return value


def load_table(model):
    """A model table: a JSON path, or the name of one in mlsl_tf/sim_models. ValueError naming
    the problem (unknown name, unreadable or malformed file)."""
    path = pathlib.Path(model)
    if not (path.suffix == ".json" or os.sep in str(model)) and not path.exists():
        path = MODELS / f"{model}.json"
        if not path.exists():
            raise ValueError(f"unknown model {model!r}: known models are {', '.join(known_models())}, "
                             "or give the path of a JSON table")
    try:
        table = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"cannot read the model table {path}: {e.strerror}") from None
    except ValueError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    if not isinstance(table, dict) or not isinstance(table.get("layers"), list) or not table["layers"]:
        raise ValueError(f"{path}: a model table is a JSON object with a non-empty \"layers\" list")
    return table


def timed_layers(table, step_compute=None, bwd_ratio=2.0):
    """[(name, fwd_s, bwd_s, [bytes...])]: the table's own times, or step_compute split by FLOPs."""
    layers = table["layers"]
    if all("fwd_s" in l for l in layers):
        return [(l["name"], l["fwd_s"], l["bwd_s"], list(l["grads"])) for l in layers]
    if step_compute is None:
        raise ValueError("this table has FLOPs, not times: give the per-step compute time")
    total = sum(l["flops"] for l in layers)
    fwd_total = step_compute / (1 + bwd_ratio)
    return [(l["name"], fwd_total * l["flops"] / total, bwd_ratio * fwd_total * l["flops"] / total, list(l["grads"]))
            for l in layers]


def config_text(layers, nodes, bandwidth, latency, policy, ranks_per_host=1, allreduce="auto", gamma=0.0,
                steps=6, warmup=2, label="", overrides=None, codec=0.0, variance=0.0, seed=1, hierarchical=True,
                latency_shm=None):
    """The text mlsl_sim reads (ops/core/sim/training.h: ParseConfig). variance: sigma of ln(each
    rank's step compute), the step paced by the slowest of `nodes` draws (seeded by `seed`);
    hierarchical=False: one allreduce over every rank, ranks_per_host sharing a host's link;
    latency_shm: seconds per message between ranks of one host (None: the simulator's default)."""
    keys = dict(DEFAULTS)
    keys.update(POLICIES[policy] if isinstance(policy, str) else policy)
    keys.update(overrides or {})
    lines = [f"label {label or policy}", f"ranks {nodes}", f"ranks_per_host {ranks_per_host}",
             f"alpha {latency!r}", f"beta {1.0 / bandwidth!r}", f"gamma {gamma!r}", f"codec {codec!r}",
             f"allreduce {allreduce}", f"hierarchical {int(bool(hierarchical))}",
             f"variance {float(variance)!r}", f"seed {int(seed)}",
             f"steps {steps}", f"warmup {warmup}"]
    if latency_shm is not None:
        lines.append(f"alpha_shm {float(latency_shm)!r}")
    lines += [f"{k} {v!r}" if isinstance(v, float) else f"{k} {int(v)}" for k, v in sorted(keys.items())]
    for name, fwd, bwd, grads in layers:
        lines.append(" ".join(["layer", re.sub(r"\s", "_", name), repr(fwd), repr(bwd)] + [str(int(g)) for g in grads]))
    return "\n".join(lines) + "\n"


def find_binary():
    """$MLSL_SIM_BINARY, else the simulator `pip install` put beside this file, else the source
    tree's build/mlsl_sim (`make sim`)."""
    env = os.environ.get("MLSL_SIM_BINARY")
    candidates = [pathlib.Path(env)] if env else [HERE / "mlsl_sim", HERE.parent / "build" / "mlsl_sim"]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    raise FileNotFoundError("the simulator binary is missing (looked for " + ", ".join(map(str, candidates))
                            + "): reinstall mlsl_tf with pip, or run `make sim` in the source tree")


def run_config(text, binary=None):
    """Runs mlsl_sim on one config; returns its result as a dict."""
    out = subprocess.run([binary or find_binary()], input=text, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"mlsl_sim failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def keras_table(name="resnet50"):
    """A table from keras.applications (weights=None: nothing is downloaded): per layer in
    forward order, float32 bytes of its trainable weights and forward FLOPs per image (2 per
    multiply-add for Conv2D/Dense, ELEMENTWISE_FLOPS per output element otherwise)."""
    import keras  # noqa: PLC0415 (only this function needs TensorFlow)
    builders = {"resnet50": keras.applications.ResNet50, "mobilenetv2": keras.applications.MobileNetV2,
                "vgg16": keras.applications.VGG16, "resnet101": keras.applications.ResNet101,
                "inceptionv3": keras.applications.InceptionV3}
    model = builders[name](weights=None)
    layers = []
    for layer in model.layers:
        shape = layer.output.shape
        elements = 1
        for d in shape[1:]:
            elements *= int(d)
        grads = [int(w.numpy().size) * 4 for w in layer.trainable_weights]
        if isinstance(layer, keras.layers.Conv2D):
            kh, kw = layer.kernel_size
            flops = 2 * elements * kh * kw * int(layer.input.shape[-1]) // (layer.groups or 1)
        elif isinstance(layer, keras.layers.DepthwiseConv2D):
            kh, kw = layer.kernel_size
            flops = 2 * elements * kh * kw
        elif isinstance(layer, keras.layers.Dense):
            flops = 2 * elements * int(layer.input.shape[-1])
        elif isinstance(layer, keras.layers.InputLayer):
            continue
        else:
            flops = ELEMENTWISE_FLOPS * elements
        layers.append({"name": layer.name, "flops": int(flops), "grads": grads})
    return {"model": name, "source": f"keras.applications.{builders[name].__name__}(weights=None), Keras "
            f"{keras.__version__}; FLOPs per image, forward", "flops_per_image": sum(l["flops"] for l in layers),
            "layers": layers}


def measure_step_seconds(name, batch, steps=3):
    """Seconds per training step of the Keras model on this machine (random data, SGD)."""
    import time  # noqa: PLC0415
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    model = {"resnet50": keras.applications.ResNet50}[name](weights=None)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
    x = np.random.rand(batch, 224, 224, 3).astype("float32")
    y = np.random.randint(0, 1000, size=(batch,))
    model.train_on_batch(x, y)
    start = time.perf_counter()
    for _ in range(steps):
        model.train_on_batch(x, y)
    return (time.perf_counter() - start) / steps


def plot(results, path, title=""):
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy in dict.fromkeys(r["label"] for r in results):
        rs = sorted((r for r in results if r["label"] == policy), key=lambda r: r["nodes"])
        ax.plot([r["nodes"] for r in rs], [100 * r["efficiency"] for r in rs], marker="o", label=policy)
    ax.scatter([256], [90], marker="*", s=160, color="k", zorder=5, label="MLSL paper: 90% at 256")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("nodes")
    ax.set_ylabel("scaling efficiency (%) = compute / step")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _number(kind, minimum, strict=False):
    """An argparse type: int or float, >= minimum (> minimum when strict)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: {text!r}") from None
        if value != value or value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"{text} must be {'>' if strict else '>='} {minimum}")
        return value
    return parse


def _node_list(text):
    try:
        nodes = [int(n) for n in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if any(n < 1 for n in nodes):
        raise argparse.ArgumentTypeError(f"node counts must be >= 1: {text!r}")
    return nodes


def _policy_list(text):
    policies = text.split(",")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown policy {', '.join(unknown)}; the policies are {', '.join(POLICIES)}")
    return policies


def _checked(parse):
    def check(text):
        try:
            parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text  # kept as written: it labels the results
    return check


def _writable(text):
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"directory {parent} does not exist")
    return text


def build_parser():
    p = argparse.ArgumentParser(prog="python -m mlsl_tf.simulate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Policies: " + ", ".join(POLICIES) + " (see the module's docstring). "
                                "Example: python -m mlsl_tf.simulate --model resnet50 --nodes 8,64 --link 10gbit")
    p.add_argument("--model", default="resnet50", help="a table in mlsl_tf/sim_models (" + ", ".join(known_models())
                   + ") or the path of a JSON table (default: %(default)s)")
    p.add_argument("--nodes", default="8,64,256,1024", type=_node_list,
                   help="comma-separated rank counts; hosts = nodes / ranks-per-host (default: %(default)s)")
    p.add_argument("--link", default="100gbit", type=_checked(parse_rate),
                   help="per-host link bandwidth, e.g. 100gbit, 800mbit, 12.5GB (bytes) (default: %(default)s)")
    p.add_argument("--latency", default="1us", type=_checked(parse_seconds),
                   help="alpha: per-message latency between hosts, e.g. 1us, 2.5ms (default: %(default)s)")
    p.add_argument("--latency-shm", type=_checked(parse_seconds),
                   help="per-message latency between ranks of one host, e.g. 5.7us (default: 0.3us, shared memory)")
    p.add_argument("--ranks-per-host", type=_number(int, 1), default=1,
                   help="ranks sharing one host's link (default: %(default)s)")
    p.add_argument("--policies", default=",".join(POLICIES), type=_policy_list,
                   help="comma-separated policies to compare (default: %(default)s)")
    p.add_argument("--batch", type=_number(int, 1), default=64, help="images per node per step (default: %(default)s)")
    p.add_argument("--images-per-s", type=_number(float, 0, strict=True), default=100.0, help="one node's "
                   "training throughput; the default, %(default)s, is a 2-socket Xeon Gold 6148 on ResNet-50 fp32")
    p.add_argument("--step-compute", type=_number(float, 0, strict=True),
                   help="seconds of compute per step; overrides --batch / --images-per-s (default: unset)")
    p.add_argument("--measure", action="store_true",
                   help="measure the step compute with the Keras model on this machine (default: off)")
    p.add_argument("--bwd-ratio", type=_number(float, 0), default=2.0,
                   help="backward / forward time of a layer (default: %(default)s)")
    p.add_argument("--allreduce", default="auto", choices=["auto", "rd", "rabenseifner", "ring"],
                   help="MPICH's allreduce algorithm; auto picks by size as MPICH does (default: %(default)s)")
    p.add_argument("--gamma", type=_number(float, 0), default=0.0,
                   help="seconds per byte of local reduction (default: %(default)s)")
    p.add_argument("--codec", type=_number(float, 0), default=0.0,
                   help="CPU seconds per byte of the bf16 path's encode/reduce/decode (default: %(default)s)")
    p.add_argument("--interference", type=_number(float, 0),
                   help="compute is 1 + this slower while the link carries data (fitted by "
                   "benchmarks/calibrate_sim.py; default: 0, a dedicated communication core)")
    p.add_argument("--contention", type=_number(float, 0),
                   help="the link is 1 + this slower while compute runs (fitted; default: 0)")
    p.add_argument("--chunk-bytes", type=_number(int, 1),
                   help=f"MLSL_TF_CHUNK_BYTES (default: the policy's, else {DEFAULTS['chunk_bytes']})")
    p.add_argument("--inflight", type=_number(int, 1),
                   help=f"MLSL_TF_INFLIGHT (default: the policy's, else {DEFAULTS['inflight']})")
    p.add_argument("--fusion-threshold", type=_number(int, 0),
                   help=f"MLSL_TF_FUSION_THRESHOLD in bytes (default: the policy's, else {DEFAULTS['fusion_threshold']})")
    p.add_argument("--variance", default="measured", type=_checked(parse_variance),
                   help="step-time variance: sigma of ln(each rank's step compute), lognormal of mean 1, the "
                   "step paced by the slowest rank; 'measured' is this machine's (sim_models/step_variance.json), "
                   "0 none (default: %(default)s)")
    p.add_argument("--seed", type=_number(int, 0), default=1,
                   help="seed of the variance's draws: equal seeds, equal results (default: %(default)s)")
    p.add_argument("--flat", action="store_true",
                   help="one allreduce over every rank, the ranks of a host sharing its link (NCCL's ring over "
                   "servers of several GPUs), not MPICH's SMP-aware reduce/allreduce/bcast (default: off)")
    p.add_argument("--steps", type=_number(int, 4), default=40,
                   help="simulated steps, the first 2 of them warm-up; with variance, more steps average "
                   "more slowest-rank draws (default: %(default)s)")
    p.add_argument("--out", type=_writable, help="also append the JSON lines to this file (default: none)")
    p.add_argument("--png", type=_writable, help="draw efficiency vs nodes into this PNG (default: none)")
    return p


def main(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    try:
        table = load_table(a.model)
        binary = find_binary()
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e))
    compute = a.step_compute
    if a.measure:
        compute = measure_step_seconds(table["model"], a.batch)
    elif compute is None:
        compute = a.batch / a.images_per_s
    try:
        layers = timed_layers(table, compute, a.bwd_ratio)
    except (KeyError, TypeError, ValueError) as e:
        p.error(f"model table {a.model}: {type(e).__name__}: {e}")
    overrides = {k: v for k, v in (("chunk_bytes", a.chunk_bytes), ("inflight", a.inflight),
                                   ("fusion_threshold", a.fusion_threshold), ("interference", a.interference),
                                   ("contention", a.contention))
                 if v is not None}
    results = []
    for nodes in a.nodes:
        for policy in a.policies:
            text = config_text(layers, nodes, parse_rate(a.link), parse_seconds(a.latency), policy,
                               a.ranks_per_host, a.allreduce, a.gamma, a.steps, overrides=overrides,
                               codec=a.codec, variance=parse_variance(a.variance), seed=a.seed,
                               hierarchical=not a.flat,
                               latency_shm=parse_seconds(a.latency_shm) if a.latency_shm else None)
            r = run_config(text, binary)
            r.update(model=table.get("model", a.model), link=a.link, latency=a.latency)
            r.pop("stats", None)
            results.append(r)
            line = json.dumps(r)
            print(line, flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(line + "\n")
    if a.png:
        plot(results, a.png, f"{table.get('model', a.model)}: {a.link}, {a.latency}, {a.ranks_per_host} rank/host, "
                             f"{compute * 1e3:.0f} ms compute/step (simulated)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
