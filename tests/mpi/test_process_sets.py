"""Horovod's process sets on N ranks (2, 3, 4): static sets given to init(), dynamic ones added and
removed later (ids reused lowest first, as Horovod does), the *_op queries, Horovod's error classes,
and what a rank outside a set gets from the tape and the optimizers (its own gradients).

The module restarts mlsl_tf with init(process_sets=[even, odd]) when its tests start -- the
conftest's init() had none -- so every rank registers the two sets the way a Horovod script does."""

import os

import numpy as np
import pytest
import tensorflow as tf

import keras
import mlsl_tf as hvd

R, N = hvd.rank(), hvd.size()
EVEN, ODD = list(range(0, N, 2)), list(range(1, N, 2))
MODES = ["eager", "graph"]

even_set, odd_set = hvd.ProcessSet(EVEN), hvd.ProcessSet(ODD)
mine, other = (even_set, odd_set) if R in EVEN else (odd_set, even_set)


@pytest.fixture(scope="module", autouse=True)
def _the_two_sets():
    """Registered when the file's tests start, not when it is collected: the MPI suite collects
    every file in one session before it runs the first test."""
    hvd.shutdown()
    hvd.init(process_sets=[even_set, odd_set])


def run(mode, fn, *args):
    return (tf.function(fn) if mode == "graph" else fn)(*args)


def test_init_registers_the_static_sets_in_order():
    assert (even_set.process_set_id, odd_set.process_set_id) == (1, 2)
    assert hvd.groups.ids_and_ranks() == {0: list(range(N)), 1: EVEN, 2: ODD}
    assert str(odd_set) == f"ProcessSet(process_set_id=2, ranks={ODD}, mpi_comm=None)"
    assert mine.included() and not other.included()
    assert mine.rank() == mine.ranks.index(R)
    with pytest.raises(ValueError, match="not a member"):
        other.rank()


def test_init_refuses_duplicates_on_every_rank():
    # a second init() registers what is new; a duplicate entry is refused before anything is added
    with pytest.raises(ValueError, match="entry number 0 is a duplicate"):
        hvd.init(process_sets=[hvd.ProcessSet(range(N))])  # the global set
    with pytest.raises(ValueError, match="entry number 1 is a duplicate"):
        hvd.init(process_sets=[even_set, hvd.ProcessSet(EVEN)])
    with pytest.raises(ValueError, match="list of mlsl_tf.ProcessSet"):
        hvd.init(process_sets=[EVEN])
    assert hvd.groups.ids_and_ranks() == {0: list(range(N)), 1: EVEN, 2: ODD}


@pytest.mark.parametrize("mode", MODES)
def test_size_and_included_ops_also_outside_the_set(mode):
    sizes = run(mode, lambda: [hvd.size_op(process_set_id=s.process_set_id) for s in (even_set, odd_set)])
    assert [int(x) for x in sizes] == [len(EVEN), len(ODD)]
    included = run(mode, lambda: [hvd.process_set_included_op(process_set_id=i) for i in (0, 1, 2)])
    assert [int(x) for x in included] == [1, int(R in EVEN), int(R in ODD)]
    with pytest.raises(ValueError, match="process set id 7 is not registered"):
        hvd.process_set_included_op(process_set_id=7)


@pytest.mark.parametrize("mode", MODES)
def test_collectives_within_each_set(mode):
    x = tf.constant([float(R), 1.0])
    total = run(mode, lambda: hvd.allreduce(x, op=hvd.Sum, process_set=mine, name="ps.sum"))
    np.testing.assert_array_equal(total.numpy(), [sum(mine.ranks), len(mine.ranks)])
    gathered = run(mode, lambda: hvd.allgather(tf.constant([R]), process_set=mine, name="ps.gather"))
    np.testing.assert_array_equal(gathered.numpy(), mine.ranks)
    root = mine.ranks[-1]
    got = run(mode, lambda: hvd.broadcast(tf.constant([R]), root_rank=root, process_set=mine, name="ps.bcast"))
    np.testing.assert_array_equal(got.numpy(), [root])


def test_size_op_takes_the_set_itself_and_init_takes_any_iterable():
    assert int(hvd.size_op(process_set_id=odd_set)) == len(ODD)
    hvd.init(process_sets=(ps for ps in [even_set, odd_set]))  # registered already: nothing to do
    with pytest.raises(ValueError, match="list of mlsl_tf.ProcessSet"):
        hvd.init(process_sets=5)
    if N > 2:  # a set that is new: registered from a generator
        extra = hvd.ProcessSet([0, 1])
        hvd.init(process_sets=(ps for ps in [even_set, extra]))
        assert extra.process_set_id == 3 and hvd.remove_process_set(extra)


def test_adasum_tape_outside_the_set_keeps_local_gradients():
    x = tf.constant([float(R + 1), 1.0])
    with tf.GradientTape() as g:
        g.watch(x)
        y = tf.reduce_sum(x * x)
    tape = hvd.DistributedGradientTape(g, op=hvd.Adasum, process_set=odd_set)  # 1 or 2 ranks at N <= 4
    dx, = tape.gradient(y, [x])
    if R not in ODD:
        np.testing.assert_array_equal(dx.numpy(), 2 * x.numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match="not a member") if R not in ODD else _nothing():
        hvd.allreduce(tf.ones(2), op=hvd.Adasum, process_set=odd_set, name="ps.adasum")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_horovod_error_classes():
    with pytest.raises(tf.errors.InvalidArgumentError, match="not a member"):
        hvd.allreduce(tf.ones(4), process_set=other, name="ps.foreign")
    fake = hvd.ProcessSet([0])
    fake.process_set_id = 10
    with pytest.raises(ValueError, match="process set id 10 is not registered"):
        hvd.allreduce(tf.ones(4), process_set=fake)


def test_broadcast_variables_returns_an_op_when_building_a_graph():
    var = tf.Variable([R, R + 10])
    root = mine.ranks[0]

    @tf.function
    def step():
        op = hvd.broadcast_variables([var], root_rank=root, process_set=mine)
        assert isinstance(op, tf.Operation)
        with tf.control_dependencies([op]):
            return var.read_value()

    np.testing.assert_array_equal(step().numpy(), [root, root + 10])
    assert hvd.broadcast_variables([var], root_rank=root, process_set=mine) is None  # eager


def test_tape_outside_the_set_keeps_local_gradients():
    x = tf.constant(float(R))
    with tf.GradientTape() as g:
        g.watch(x)
        y = x * x
    dx, = hvd.DistributedGradientTape(g, process_set=even_set).gradient(y, [x])
    expected = 2.0 * np.mean(EVEN) if R in EVEN else 2.0 * R
    assert float(dx) == pytest.approx(expected)


@pytest.mark.parametrize("cross_iteration", [True, False])
def test_keras_optimizer_outside_the_set_applies_local_gradients(cross_iteration):
    v = keras.Variable([0.0])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=even_set, cross_iteration=cross_iteration,
                                   name=f"ps.keras.{cross_iteration}")

    @tf.function
    def step():
        opt.apply([tf.constant([-float(R)])], [v])

    for _ in range(2):
        step()
    expected = 2 * np.mean(EVEN) if R in EVEN else 2.0 * R
    assert float(v.numpy()[0]) == pytest.approx(expected)


@pytest.mark.parametrize("kind", ["legacy", "new"])
def test_tf_keras_optimizer_outside_the_set_applies_local_gradients(kind):
    import tf_keras
    v = tf.Variable([0.0])
    sgd = tf_keras.optimizers.legacy.SGD(1.0) if kind == "legacy" else tf_keras.optimizers.SGD(1.0)
    opt = hvd.DistributedOptimizer(sgd, process_set=even_set, name=f"ps.tf_keras.{kind}")
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = -float(R) * tf.reduce_sum(v)
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    expected = 2 * np.mean(EVEN) if R in EVEN else 2.0 * R
    assert float(v.numpy()[0]) == pytest.approx(expected)


@pytest.mark.parametrize("scale", [True, False])
def test_tf1_optimizer_local_variables(scale):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        shared = tf.compat.v1.get_variable(f"shared{scale}", initializer=[0.0])
        local = tf.compat.v1.get_variable(f"local{scale}", initializer=[0.0])
        loss = -float(R + 1) * tf.reduce_sum(shared + local)
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), scale_local_gradients=scale,
                                       name=f"ps.tf1.local.{scale}")
        opt.register_local_var(local)
        train = opt.minimize(loss, var_list=[shared, local])
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        got = [float(x[0]) for x in sess.run([shared, local])]
    # the shared gradient is averaged; the local one is this rank's, divided by the world size (Horovod)
    assert got == pytest.approx([np.mean(np.arange(N) + 1), (R + 1.0) / (N if scale else 1)])


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("world", [False, True])
def test_tf1_optimizer_with_a_process_set(passes, world):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        v = tf.compat.v1.get_variable(f"v{passes}", initializer=[0.0])
        loss = -float(R + 1) * tf.reduce_sum(v)  # gradient -(R + 1)
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0),
                                       process_set=None if world else even_set,
                                       backward_passes_per_step=passes, average_aggregated_gradients=True,
                                       name=f"ps.tf1.{passes}.{world}")
        assert opt._optimizer.get_name() == "GradientDescent"
        step_var = tf.compat.v1.get_variable(f"step{passes}", initializer=tf.constant(0, tf.int64), trainable=False)
        train = opt.minimize(loss, var_list=[v], global_step=step_var)
        sess.run(tf.compat.v1.global_variables_initializer())
        values = []
        for _ in range(2 * passes):
            sess.run(train)
            values.append(float(sess.run(v)[0]))
        assert sess.run(step_var) == 2 * passes  # every call counts, applied or not
    step = np.mean(np.arange(N) + 1) if world else np.mean([r + 1 for r in EVEN]) if R in EVEN else R + 1.0
    # applied once every `passes` calls, with the mean of the accumulated gradients
    expected = [step * ((i + 1) // passes) for i in range(2 * passes)]
    np.testing.assert_allclose(values, expected, rtol=1e-6)


def test_without_dynamic_sets_only_init_makes_them(monkeypatch):
    monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "0")
    with pytest.raises(ValueError, match="needs MLSL_TF_DYNAMIC_PROCESS_SETS=1"):
        hvd.add_process_set([0])
    with pytest.raises(ValueError, match="needs MLSL_TF_DYNAMIC_PROCESS_SETS=1"):
        hvd.remove_process_set(even_set)
    assert hvd.groups.ids_and_ranks() == {0: list(range(N)), 1: EVEN, 2: ODD}


def test_dynamic_sets_reuse_the_lowest_free_id_and_their_own_names():
    """Last in the file: removes the static sets. A collective name used in a removed set and then
    in the set that took over its id is negotiated afresh (the new set's members and shape), not
    taken from what the old set agreed on."""
    assert hvd.remove_process_set(even_set) and hvd.remove_process_set(odd_set)
    assert even_set.process_set_id is None and hvd.groups.ids_and_ranks() == {0: list(range(N))}
    assert not hvd.remove_process_set(even_set)  # as Horovod: False for a set that is not registered
    assert not hvd.remove_process_set(hvd.global_process_set)
    first = hvd.add_process_set([0])
    second = hvd.add_process_set(range(1, N))
    assert (first.process_set_id, second.process_set_id) == (1, 2)
    if R == 0:
        out = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum, process_set=first, name="ps.reused")
        np.testing.assert_array_equal(out.numpy(), [1.0, 2.0])
    hvd.remove_process_set(first)
    again = hvd.add_process_set([0, N - 1] if N > 2 else [0])
    assert again.process_set_id == 1
    if again.included():
        # the same name, shape and op: only the set's members differ (rank N-1 joined)
        out = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum, process_set=again, name="ps.reused")
        np.testing.assert_array_equal(out.numpy(), np.array([1.0, 2.0]) * len(again.ranks))
    with pytest.raises(ValueError, match="already exists"):
        hvd.add_process_set(list(reversed(again.ranks)))
    with pytest.raises(ValueError, match="already exists"):
        hvd.add_process_set(range(N))
    hvd.remove_process_set(again)
    hvd.remove_process_set(second)
    assert hvd.groups.ids_and_ranks() == {0: list(range(N))}


def _rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_add_remove_cycles_run_in_constant_memory():
    """After the test above (every dynamic set removed). 2,500 add/remove cycles, a collective in
    the set now and then: a removed set's communicator is freed (MPI has a few thousand contexts;
    about 2,000 cycles used to abort a rank) and nothing else grows once the name cache is full --
    with MLSL_TF_CACHE_CAPACITY=256 (each cycle agrees two names), RSS over the last 2,000 cycles
    grows by less than 128 KiB (it used to grow by about 1.5 KiB a cycle)."""
    hvd.shutdown()
    os.environ["MLSL_TF_CACHE_CAPACITY"] = "256"
    try:
        hvd.init()
        base = None
        for i in range(2500):
            ps = hvd.add_process_set([i % N])
            assert ps.process_set_id == 1
            if i % 250 == 0 and ps.included():
                out = hvd.allreduce(tf.constant([float(i)]), op=hvd.Sum, process_set=ps, name="ps.cycle")
                assert out.numpy()[0] == float(i)
            assert hvd.remove_process_set(ps)
            if i == 500:
                base = _rss_kib()
        grown = _rss_kib() - base
        assert grown < 128, f"RSS grew by {grown} KiB over 2,000 add/remove cycles"
    finally:
        del os.environ["MLSL_TF_CACHE_CAPACITY"]
        hvd.shutdown()
        hvd.init()
