"""Cross-iteration overlap, MLSL's layer-wise wait: a training step starts its gradients'
reductions and returns; the next access of each variable -- normally the next step's forward
pass reaching that layer -- first waits for that variable's reduced gradient and applies its
update. The late layers' reductions then finish while the next forward pass runs, and the
priority order (first layer first) pays off in step time.

Why this mechanism. A tf.function call returns only when every op in it has finished, so an
update inside the step that produced the gradient makes the next step wait for the whole
reduction, and several steps in one function (a while loop) have the same barrier between
iterations. So the update of variable i moves to just before variable i's next access:

- `Deferral.apply` (the optimizer's apply) ends a step by recording its learning rate and
  iteration, starting one MlslStartAllreduce per dense gradient (it submits and returns; the
  runtime keeps the result under the collective's name) and advancing the iteration counter,
  as Keras does.
- Every variable the optimizer updates gets an access hook (its class is swapped for a subclass
  whose `value` and `assign*` call the hook first; a tf_keras resource variable's reads and
  gathers as well). In a traced function the first access of
  the variable in each graph, and the first after a start, is preceded by MlslTakeResult and,
  under a tf.cond on its `found` output, the optimizer's own update of that one variable
  (loss-scale unscaling, clipnorm/clipvalue, weight decay, update_step, constraint) with the
  recorded learning rate and iteration. In eager mode any access takes and applies while
  results are parked. Both ops take the variable's resource handle, so TensorFlow orders them
  with that variable's other reads and writes only: layer i's forward waits for layer i's
  gradient and nothing else.

The arithmetic is the optimizer's own, with the learning rate and iteration synchronous
training would use, so the weights after every step are the same; a variable read from outside
(get_weights, save, evaluate, a callback) gets its update first, and reading optimizer slots
eagerly applies every pending update of that optimizer. Sparse gradients (IndexedSlices,
reduced by allgather) and gradients a custom loop changed after the tape reduced them are
applied at once, in their own step.

The first graph in which variables get their hooks cannot use them (its forward pass read them
before), so that graph applies synchronously; creating this optimizer's step variables there
makes tf.function trace once more for later calls, and that trace is deferred. Optimizers whose
update needs every gradient at once (global_clipnorm, gradient accumulation, EMA, loss-scale
optimizers, classes overriding the update path) always apply synchronously.

Keras 3 and tf_keras (Keras 2) optimizers alike: a Deferral reaches its optimizer only through
`_compat(optimizer)`, keras3_compat or keras2_compat, which have the same functions (the tf_keras
side, and how its wrapper hands gradients over: mlsl_tf/optimizer/keras2.py).
MLSL_TF_CROSS_ITERATION=0 (or cross_iteration=False on DistributedOptimizer /
DistributedGradientTape) turns the mechanism off.
"""

import contextlib
import logging
import threading
import weakref

import tensorflow as tf

from mlsl_tf import _library, basics, keras2_compat, keras3_compat
from mlsl_tf.ops import group_id_of

SETTING = "MLSL_TF_CROSS_ITERATION"
_log = logging.getLogger("mlsl_tf")
_local = threading.local()  # .busy: ids of the deferrals whose own code is running on this thread
_graph_takes = weakref.WeakKeyDictionary()  # graph -> ids of variables taken since their last start
_offers = weakref.WeakKeyDictionary()  # graph -> {id(reduced tensor): _Offer}, from DistributedGradientTape
_prefixes = {}  # collective-name prefix -> deferrals using it so far (the same order on every rank)
_deferrals = weakref.WeakSet()


def enabled(choice=None):
    """Whether cross-iteration overlap is on: `choice` when given, else MLSL_TF_CROSS_ITERATION."""
    if choice is not None:
        return bool(choice)
    return _library.yes_no(SETTING, _library.settings()[SETTING].value)


def _ops():
    return _library.load_ops()


def _keras():
    import keras
    return keras


def _compat(optimizer):
    """The compat module of `optimizer`'s Keras (tf_keras or Keras 3): the seam every private
    member the deferred update relies on goes through."""
    return keras2_compat if keras2_compat.is_keras2(optimizer) else keras3_compat


@contextlib.contextmanager
def _busy(deferral):
    busy = getattr(_local, "busy", None)
    if busy is None:
        busy = _local.busy = set()
    mine = id(deferral) not in busy
    busy.add(id(deferral))
    try:
        yield
    finally:
        if mine:
            busy.discard(id(deferral))


def _not_recorded():
    """Ops made here are not recorded by gradient tapes (the update is not part of the loss)."""
    try:
        from tensorflow.python.eager import record
        return record.stop_recording()
    except (ImportError, AttributeError):  # pragma: no cover - older layout
        return contextlib.nullcontext()


def why_not_deferred(optimizer, cls=None):
    """'' when `optimizer`'s update can be split per variable and deferred, else the reason.
    `cls`: the class whose update path runs (DistributedOptimizer passes the wrapped class)."""
    cls = cls or type(optimizer)
    if keras2_compat.is_keras2(optimizer):
        return keras2_compat.why_not_deferred(optimizer, cls)
    keras = _keras()
    base = keras.optimizers.Optimizer
    if not isinstance(optimizer, base):
        return "not a Keras 3 optimizer"
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return "LossScaleOptimizer checks every gradient before applying any"
    overridden = keras3_compat.overridden_update_path(cls)
    if overridden:
        return f"{cls.__name__} overrides {overridden}"
    if getattr(optimizer, "use_ema", False):
        return "use_ema updates every variable's average together"
    if getattr(optimizer, "gradient_accumulation_steps", None):
        return "gradient_accumulation_steps"
    if getattr(optimizer, "global_clipnorm", None):
        return "global_clipnorm needs every gradient at once"
    return ""


def _graph_and_outer_graphs():
    graph = tf.compat.v1.get_default_graph()
    while graph is not None:
        yield graph
        graph = getattr(graph, "outer_graph", None)


class _Record:
    """A variable whose update is deferred: the collective carrying its gradient."""

    __slots__ = ("deferral", "variable", "name", "priority", "options", "wire_dtype", "ctx", "graph")

    def before_access(self, _hooked=None):
        var = self.variable
        if tf.executing_eagerly():
            if _library.c_api().mlsl_tf_parked() > 0:
                self.deferral.take_and_apply(var, self)
            return
        taken = _graph_takes.setdefault(tf.compat.v1.get_default_graph(), set())
        if id(var) not in taken:
            taken.add(id(var))
            self.deferral.take_and_apply(var, self)


class _StateRecord:
    """An optimizer slot: read eagerly from outside, it first gets every pending update."""

    __slots__ = ("deferral",)

    def before_access(self, _hooked=None):
        if tf.executing_eagerly() and _library.c_api().mlsl_tf_parked() > 0:
            self.deferral.flush()


def _before_access(var):
    record = var.__dict__.get("_mlsl_record")
    if record is None:
        return
    busy = getattr(_local, "busy", None)
    if busy and id(record.deferral) in busy:
        return
    compat = record.deferral.compat
    if compat.computing_shapes_only():
        return
    if compat.exporting():  # a SavedModel's functions get no takes: what is pending is applied now
        with tf.init_scope():
            record.before_access()
        return
    record.before_access()


def _hook(var, record):
    current = var.__dict__.get("_mlsl_record")
    if current is not None and current.deferral is not record.deferral:
        raise ValueError(f"variable {getattr(var, 'path', var.name)!r} is already updated by another optimizer "
                         "with cross-iteration overlap; an optimizer's variables must be its own")
    var._mlsl_record = record
    record.deferral.compat.hook_variable_accesses(var, _before_access)


class _Offer:
    """A gradient DistributedGradientTape reduced: the reduction can be deferred instead."""

    __slots__ = ("reduced", "local", "options", "priority")

    def __init__(self, reduced, local, options, priority):
        self.reduced, self.local, self.options, self.priority = reduced, local, options, priority


def offer(reduced, local, options, priority):
    """Called by DistributedGradientTape in a traced function: `reduced` (its output) is the
    allreduce of `local`; a Keras optimizer applying `reduced` unchanged may start that
    reduction itself and defer the update. Unused, the tape's allreduce is pruned from the
    function."""
    _offers.setdefault(tf.compat.v1.get_default_graph(), {})[id(reduced)] = _Offer(reduced, local, options, priority)
    install_optimizer_hook()


def install_optimizer_hook():
    """Keras optimizers' apply() learns to defer gradients offered by DistributedGradientTape.
    Installed when such a tape is made: `opt.apply(tape.gradient(...))` looks `apply` up before
    the gradient is computed. The one global patch (keras3_compat.install_apply_hook says why
    and how it is scoped); idempotent."""
    keras3_compat.install_apply_hook(_apply_offered)


def _apply_offered(optimizer, grads, variables):
    """Defers the update of the gradients a DistributedGradientTape offered; False (nothing
    done) when there are none or the optimizer cannot defer."""
    if tf.executing_eagerly() or len(grads) != len(variables):
        return False
    offers = _offers.get(tf.compat.v1.get_default_graph(), {})
    found = [None if g is None else offers.get(id(g)) for g in grads]
    found = [o if o is not None and o.reduced is g else None for o, g in zip(found, grads)]
    if not any(found) or getattr(optimizer, "_mlsl_options", None) is not None:
        return False  # a DistributedOptimizer reduces (and defers) by itself
    keras = _keras()
    if not all(isinstance(v, keras.Variable) for v in variables):
        return False
    reason = why_not_deferred(optimizer)
    if reason:
        _log.info("mlsl_tf: %s applies synchronously: %s", type(optimizer).__name__, reason)
        return False
    if not optimizer.built:
        keras3_compat.build_optimizer(optimizer, variables)
    deferral = Deferral.of(optimizer, optimizer.name)
    new = [(v, o) for v, o in zip(variables, found) if o is not None and v.__dict__.get("_mlsl_record") is None]
    for v, o in new:
        deferral.register(v, o.options, o.priority)
    if new:  # this graph read them before they had hooks
        return False
    items = []
    for g, v, o in zip(grads, variables, found):
        if g is not None:
            items.append((o.local, v, o.options, o.priority) if o is not None else (g, v, None, 0))
    deferral.apply(items)
    return True


class Deferral:
    """The deferred updates of one Keras optimizer: its variables' records, and the learning
    rate and iteration of the step whose gradients are in flight."""

    def __init__(self, optimizer, prefix):
        count = _prefixes.get(prefix, 0)
        _prefixes[prefix] = count + 1
        self.prefix = f"{prefix}.deferred" + (f".{count}" if count else "")
        self.optimizer = optimizer
        self.compat = _compat(optimizer)
        self.records = {}  # id(variable) -> _Record
        self.variables = []
        self.iteration = self.learning_rate = None
        object.__setattr__(optimizer, "_mlsl_deferral", self)
        _deferrals.add(self)

    @classmethod
    def of(cls, optimizer, prefix):
        """The optimizer's deferral, made on first use (its step variables too)."""
        deferral = optimizer.__dict__.get("_mlsl_deferral")
        if deferral is None:
            deferral = cls(optimizer, prefix)
        deferral._make_step_variables()
        return deferral

    @tf.autograph.experimental.do_not_convert  # its try/except must run as Python in a trace
    def _make_step_variables(self):
        """The step's iteration and learning rate, read by its deferred updates. Made where the
        caller is (in a function's first trace they make tf.function trace again for later
        calls); not tracked, so saved files are unchanged."""
        if self.iteration is not None:
            return
        opt, compat = self.optimizer, self.compat
        lr_dtype = compat.learning_rate_dtype(opt)
        iteration_dtype = compat.iterations_variable(opt).dtype

        def make(variable=tf.Variable):
            return (variable(0, dtype=iteration_dtype, trainable=False, name="mlsl_step_iteration"),
                    variable(0, dtype=lr_dtype, trainable=False, name="mlsl_step_learning_rate"))
        try:
            self.iteration, self.learning_rate = make()
        except ValueError:  # a later trace of a tf.function, which may not create variables: made
            # eagerly, by the class itself (tf.Variable would go through the function's creator check)
            from tensorflow.python.ops.resource_variable_ops import ResourceVariable
            with tf.init_scope():
                self.iteration, self.learning_rate = make(ResourceVariable)
        state = _StateRecord()
        state.deferral = self
        skip = compat.step_state_ids(opt)
        for v in compat.optimizer_variables(opt):
            if id(v) not in skip and v.__dict__.get("_mlsl_record") is None and compat.hookable(v):
                _hook(v, state)

    def register(self, var, options, priority):
        """`var`'s gradient is reduced as `options` say, with `priority`, and applied later."""
        record = _Record()
        record.deferral, record.variable = self, var
        record.name = f"{self.prefix}.grad.{len(self.variables)}"
        record.priority = int(priority)
        record.options = options
        with tf.init_scope():
            sample, record.ctx = options.compression.compress(tf.zeros([], var.dtype))
        record.wire_dtype = sample.dtype
        record.graph = None if tf.executing_eagerly() else weakref.ref(tf.compat.v1.get_default_graph())
        _hook(var, record)
        self.records[id(var)] = record
        self.variables.append(var)

    def fresh_in_this_graph(self, variables):
        """Some of `variables` got their hooks while this graph (or one it is nested in) was
        traced: it read them before."""
        if tf.executing_eagerly():
            return False
        graphs = list(_graph_and_outer_graphs())
        made_in = [self.records[id(v)].graph for v in variables if id(v) in self.records]
        return any(ref is not None and any(ref() is g for g in graphs) for ref in made_in)

    def _update(self, grad, var):
        """The optimizer's update of `var` alone, as its apply() would make it."""
        opt, compat = self.optimizer, self.compat
        with compat.step_values(opt, self.iteration, self.learning_rate), compat.no_autocast(), \
                compat.optimizer_scope(opt):
            compat.update_variable(opt, grad, var)

    def take_and_apply(self, var, record):
        """Waits for `var`'s reduced gradient, if one was started, and applies it."""
        with _busy(self), _not_recorded(), tf.name_scope("mlsl_deferred_update"):
            found, grad = _ops().mlsl_take_result(self.compat.resource_handle(var), T=record.wire_dtype,
                                                  shape=var.shape,
                                                  tensor_name=record.name)

            def update():
                self._update(record.options.compression.decompress(grad, record.ctx), var)
                return tf.constant(True)

            if tf.executing_eagerly():
                if bool(found):
                    update()
            else:
                tf.cond(found, update, lambda: tf.constant(False))

    def flush(self):
        """Applies every pending update now (eager)."""
        for var in list(self.variables):
            self.take_and_apply(var, self.records[id(var)])

    def settle(self):
        """Every update still pending is applied before what follows (it reads the recorded step
        values): in a traced step the forward pass has taken them already (nothing to add); an
        optimizer applied twice in one step waits here for its first reductions."""
        for var in self.variables:
            _before_access(var)

    @contextlib.contextmanager
    def in_step(self):
        """Around an update the optimizer applies itself, in the step: every pending update goes
        first, and its own reads and writes of the variables take nothing."""
        self.settle()
        with _busy(self):
            yield

    def apply(self, items):
        """One step: `items` are (gradient, variable, options, priority); with options, the
        local gradient to reduce and apply later; without, a reduced one to apply now."""
        opt, compat = self.optimizer, self.compat
        grads, variables = compat.filter_empty_gradients(opt, [i[0] for i in items], [i[1] for i in items])
        by_var = {id(i[1]): i for i in items}
        items = [(g,) + by_var[id(v)][1:] for g, v in zip(grads, variables)]
        self.settle()
        with _busy(self), compat.optimizer_scope(opt):
            self.iteration.assign(compat.iterations_variable(opt))
            self.learning_rate.assign(tf.cast(compat.step_learning_rate(opt), self.learning_rate.dtype))
            for grad, var, options, priority in items:
                if options is None:
                    self._update(grad, var)
                elif isinstance(grad, tf.IndexedSlices) and not options.sparse_as_dense:
                    self._update(options.reduce([grad], [priority])[0], var)
                else:
                    self._start(grad, var, options, priority)
            compat.advance_iterations(opt)

    def _start(self, grad, var, options, priority):
        record = self.records[id(var)]
        compressed, _ = options.compression.compress(tf.convert_to_tensor(grad))
        prescale, postscale = options._scale_factors()
        _ops().mlsl_start_allreduce(
            compressed, self.compat.resource_handle(var), reduce_op=options.op, prescale_factor=prescale,
            postscale_factor=postscale, tensor_name=record.name, priority=record.priority,
            process_set_id=group_id_of(options.process_set), wire_dtype=options.compression.wire)
        if not tf.executing_eagerly():
            _graph_takes.setdefault(tf.compat.v1.get_default_graph(), set()).discard(id(var))


def flush_all():
    """Applies every deferred update still pending (eager); before shutdown."""
    for deferral in list(_deferrals):
        deferral.flush()


basics.on_shutdown(before=flush_all)
