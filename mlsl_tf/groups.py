"""Groups of ranks (Horovod's process sets) and the model-parallel x data-parallel grid.

A group is a sorted list of world ranks that runs collectives among themselves; every op takes
it as `group=` (or Horovod's `process_set=`). Creating and removing groups is collective: every
rank of the world calls it, in the same order, with the same ranks, also the ranks that are not
members (the core then builds the group's communicator on all of them at once). A rank's index
in the group is its position in the sorted list, which orders an allgather's blocks and an
alltoall's splits; a broadcast's root_rank stays a world rank (it must be a member), as in Horovod.

    mp, dp = mlsl_tf.groups.grid(model_parallel=2)   # on 4 ranks: mp {0,1},{2,3}; dp {0,2},{1,3}
    y = mlsl_tf.allreduce(x, group=mp)

After mlsl_tf.shutdown() the core forgets its groups; groups made before are then invalid.
"""

import collections
import ctypes

from mlsl_tf import _library, basics
from mlsl_tf.basics import rank as _world_rank
from mlsl_tf.basics import size as _world_size


class ProcessSet:
    """A set of ranks that run collectives together (Horovod's name). `ProcessSet(ranks)` only
    describes the set; `add_process_set` registers it (collectively) and sets `process_set_id`.
    `mlsl_tf.Group(ranks)` does both at once."""

    process_set_id = None

    def __init__(self, ranks):
        if type(ranks).__module__.startswith("mpi4py"):
            raise NotImplementedError("mlsl_tf makes process sets from lists of world ranks, not from MPI "
                                      "communicators: pass the communicator's world ranks")
        try:
            ranks = list(ranks)
        except TypeError:
            raise ValueError(f"a group needs a list of ranks, got {ranks!r}") from None
        bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, int)]
        if bad:
            raise ValueError(f"a group's ranks must be ints, got {bad[0]!r} in {ranks!r}")
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        if dup:
            raise ValueError(f"a group lists each rank once; {dup} appear more than once in {ranks!r}")
        self._ranks = sorted(ranks)

    @property
    def ranks(self):
        """The world ranks in the group, sorted."""
        return list(self._ranks)

    def size(self):
        """The number of ranks in the group; None while it is not registered."""
        if self.process_set_id is None:
            return None
        return len(self.ranks)

    def included(self):
        """Whether this rank is a member (as Horovod: known from the ranks, registered or not)."""
        return _world_rank() in self.ranks

    def rank(self):
        """This rank's index in the group (its position in `ranks`); None while the group is not
        registered. Raises ValueError on a rank that is not a member (as Horovod does)."""
        if self.process_set_id is None:
            return None
        me = _world_rank()
        ranks = self.ranks
        if me not in ranks:
            raise ValueError(f"rank {me} is not a member of {self}")
        return ranks.index(me)

    def _invalidate(self):
        self.process_set_id = None

    def __repr__(self):
        # Horovod's form; mpi_comm is always None (sets are made from lists of ranks)
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm=None)"

    __str__ = __repr__


class _GlobalProcessSet(ProcessSet):
    """Every rank (id 0). Its ranks follow the current world, so it is valid across init calls."""

    process_set_id = 0

    def __init__(self):
        self._ranks = None

    @property
    def ranks(self):
        return list(range(_world_size()))

    def _invalidate(self):
        pass


global_process_set = _GlobalProcessSet()

# process_set_id -> the registered ProcessSet objects with that id (add_process_set may be given
# an object or a list of ranks; the first object registered is the canonical one).
_registered = {}


def _c_api():
    lib = _library.c_api()
    if not hasattr(lib, "mlsl_tf_add_group"):
        raise RuntimeError("this build of mlsl_tf's library has no group support; rebuild it with `make lib`")
    if lib.mlsl_tf_add_group.argtypes is None:
        lib.mlsl_tf_add_group.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.mlsl_tf_add_group.restype = ctypes.c_int
        lib.mlsl_tf_remove_group.argtypes = [ctypes.c_int]
        lib.mlsl_tf_remove_group.restype = ctypes.c_int
    return lib


def init(comm=None, process_sets=None):
    """Starts mlsl_tf (mlsl_tf.basics.init) and registers `process_sets`, Horovod's static process
    sets: a list of ProcessSet objects (every rank passes the same list), or "dynamic" (none now;
    sets are added later with add_process_set). Each gets its process_set_id; a set whose ranks
    are the whole world, or those of an earlier entry, is a duplicate: ValueError on every rank.
    A second init() registers the sets not registered yet."""
    sets = [] if process_sets is None or (isinstance(process_sets, str) and process_sets.lower() == "dynamic") \
        else process_sets
    try:
        sets = None if isinstance(sets, (str, ProcessSet)) else list(sets)
    except TypeError:
        sets = None
    if sets is None or not all(isinstance(ps, ProcessSet) for ps in sets):
        raise ValueError(f"init: process_sets must be a list of mlsl_tf.ProcessSet or 'dynamic', got {process_sets!r}")
    basics.init(comm)
    for index, ps in enumerate(sets):
        existing = _find_registered(ps.ranks)
        if existing is not None and ps.process_set_id == existing.process_set_id:
            continue  # registered by an earlier init
        if existing is not None or ps.process_set_id is not None:
            raise ValueError(f"init: process_sets entry number {index} is a duplicate of {existing or ps}")
        _add(ps)


def dynamic_process_sets():
    """Whether add_process_set / remove_process_set may run after init (MLSL_TF_DYNAMIC_PROCESS_SETS,
    or Horovod's HOROVOD_DYNAMIC_PROCESS_SETS; on unless set to 0 or another no word)."""
    name = "MLSL_TF_DYNAMIC_PROCESS_SETS"
    return _library.yes_no(name, _library.settings()[name].value,
                           yes="process sets may be added and removed after init", no="only at init")


def _check_dynamic(what):
    if not dynamic_process_sets():
        raise ValueError(f"{what} after init() needs MLSL_TF_DYNAMIC_PROCESS_SETS=1 (or HOROVOD_DYNAMIC_PROCESS_SETS=1); "
                         "it is set to 0, so only init(process_sets=[...]) makes process sets")


def ids_and_ranks():
    """{process_set_id: ranks} of every registered process set, the global one (0) included."""
    return {ps.process_set_id: ps.ranks for ps in process_sets()}


def add_process_set(process_set):
    """Registers `process_set` (a ProcessSet or a list of ranks) with the core and returns it
    with its process_set_id set. Collective: every rank calls it in the same order with the same
    ranks; otherwise every rank gets a ValueError naming the ranks that disagree."""
    _check_dynamic("add_process_set")
    return _add(process_set)


def _add(process_set):
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"{process_set} is already registered")
    ranks = process_set.ranks
    # No check of the ranks here: one rank's bad list (empty, outside the world, a group that
    # exists) must fail the creation on every rank, and the core does that (its error names the
    # rank and the reason); raised here, the other ranks would wait in the creation for this one.
    lib = _c_api()
    array = (ctypes.c_int * len(ranks))(*ranks)
    group_id = lib.mlsl_tf_add_group(array, len(ranks))
    if group_id < 0:
        raise _library.error(ValueError, f"creating the group of ranks {ranks} failed")
    process_set.process_set_id = group_id
    _registered.setdefault(group_id, []).append(process_set)
    return process_set


def remove_process_set(process_set):
    """Removes a registered group (collective, like add_process_set) and invalidates every
    object registered with its id. Returns False for the global set (never removed), else True."""
    if isinstance(process_set, ProcessSet) and process_set.process_set_id is None:
        return False  # as Horovod: never registered, or removed already
    # An id this rank does not know still goes to the core, which refuses it on every rank
    # (ranks that name different sets are refused on every rank too, naming both ids).
    group_id = id_of(process_set, registered_here=False)
    if group_id == 0:
        return False
    _check_dynamic("remove_process_set")
    if _c_api().mlsl_tf_remove_group(group_id) != 0:
        raise _library.error(ValueError, f"removing group {group_id} failed")
    for ps in _registered.pop(group_id, []):
        ps._invalidate()
    _data_parallel_of.pop(group_id, None)  # the id may be reused by an unrelated set
    if isinstance(process_set, ProcessSet):
        process_set._invalidate()
    return True


def id_of(process_set, registered_here=True):
    """The core's id of `process_set` (a registered ProcessSet, or an id registered on this rank
    unless registered_here=False); ValueError for anything else. mlsl_tf.ops.group_id_of also
    takes None (the world)."""
    if isinstance(process_set, ProcessSet):
        if process_set.process_set_id is None:
            raise ValueError(f"{process_set} is not registered (create it with mlsl_tf.Group(ranks) or "
                             "add_process_set, and not after remove_process_set or shutdown)")
        group_id = process_set.process_set_id
    elif isinstance(process_set, bool) or not isinstance(process_set, int):
        raise ValueError(f"expected a group (mlsl_tf.Group / ProcessSet) or its id, got {process_set!r}")
    else:
        group_id = process_set
    if registered_here and group_id != 0 and group_id not in _registered:
        raise ValueError(f"process set id {group_id} is not registered on this rank (known ids: "
                         f"{sorted([0] + list(_registered))})")
    return group_id


def Group(ranks):
    """Creates and registers the group of `ranks` (collective: every rank of the world calls it,
    in the same order, with the same ranks). The result is a ProcessSet with ranks, size(),
    rank() (this rank's index in it) and included()."""
    return add_process_set(ProcessSet(ranks))


def _find_registered(ranks):
    """The registered group with exactly these ranks (the global one for the whole world)."""
    if ranks == list(range(_world_size())):
        return global_process_set
    for group_id in sorted(_registered):
        if _registered[group_id][0].ranks == ranks:
            return _registered[group_id][0]
    return None


def process_set_by_id(process_set_id):
    """The registered group with this id."""
    if process_set_id == 0:
        return global_process_set
    found = _registered.get(process_set_id)
    if not found:
        raise ValueError(f"no registered group has id {process_set_id}")
    return found[0]


def process_sets():
    """Every registered group, the global one first, by id."""
    return [global_process_set] + [_registered[i][0] for i in sorted(_registered)]


def group_rank_and_size(process_set_id):
    """(this rank's index in the group, the group's size); used by the ops' gradients. Raises
    ValueError when this rank is not a member."""
    if process_set_id == 0:
        return _world_rank(), _world_size()
    group = process_set_by_id(process_set_id)
    return group.rank(), group.size()


def _forget_all():
    """Invalidates every registered group (the core has forgotten them: shutdown)."""
    for found in _registered.values():
        for ps in found:
            ps._invalidate()
    _registered.clear()
    _data_parallel_of.clear()


basics.on_shutdown(after=_forget_all)  # the core forgot them


# ---- the grid -----------------------------------------------------------------------------

Grid = collections.namedtuple("Grid", ["model_parallel", "data_parallel"])

# model-parallel group id -> the data-parallel group grid() made with it on this rank
_data_parallel_of = {}


def grid(model_parallel):
    """Splits the world into model-parallel groups of `model_parallel` consecutive ranks and
    data-parallel groups of the ranks with the same index in their model-parallel group, and
    returns this rank's two as Grid(model_parallel, data_parallel) (a 2-tuple).

    On 4 ranks with model_parallel=2: model-parallel {0,1} and {2,3}, data-parallel {0,2} and
    {1,3}. Collective: every rank creates every group, model-parallel ones first, in rank order.
    A group that already exists (the whole world is the global group) is reused."""
    k = model_parallel
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"grid: model_parallel must be a positive int, got {model_parallel!r}")
    world = _world_size()
    if world % k:
        raise ValueError(f"grid: the world size {world} is not a multiple of model_parallel={k}")
    me = _world_rank()

    def make(ranks):
        return _find_registered(list(ranks)) or Group(ranks)

    mp_groups = [make(range(start, start + k)) for start in range(0, world, k)]
    dp_groups = [make(range(index, world, k)) for index in range(k)]
    mp, dp = mp_groups[me // k], dp_groups[me % k]
    _data_parallel_of[mp.process_set_id] = dp
    return Grid(mp, dp)


def data_parallel_group_of(model_parallel_group):
    """The data-parallel group grid() returned together with `model_parallel_group` on this
    rank, or None when that group did not come from grid()."""
    return _data_parallel_of.get(id_of(model_parallel_group))


def check_reduction_group(variables, process_set):
    """Raises ValueError when a gradient reduction over `process_set` (None: the world) would
    mix different shards of a model-parallel variable, i.e. when the reduction's ranks include
    another member of the group the variable is sharded over. Used by DistributedOptimizer and
    DistributedGradientTape."""
    reduce_ranks = None
    for v in variables:
        sharded = getattr(v, "_mlsl_sharded_over", None)
        if sharded is None or sharded.process_set_id is None:
            continue
        if reduce_ranks is None:
            reduce_ranks = set((global_process_set if process_set is None else
                                process_set_by_id(id_of(process_set))).ranks)
        shared = sorted(reduce_ranks & set(sharded.ranks))
        if len(shared) > 1:
            name = getattr(v, "path", None) or getattr(v, "name", "?")
            raise ValueError(
                f"the gradient of {name!r}, sharded over the model-parallel group of ranks {sharded.ranks}, "
                f"would be reduced over ranks {sorted(reduce_ranks)}, which hold different shards of it "
                f"(ranks {shared}); reduce over the data-parallel group instead, e.g. "
                "mp, dp = mlsl_tf.groups.grid(model_parallel=K); DistributedOptimizer(opt, group=dp)")


def sharded_group(variable):
    """The model-parallel group over which `variable` is sharded, or None."""
    return getattr(variable, "_mlsl_sharded_over", None)


def replicated_group(variable):
    """The model-parallel group in which `variable` is replicated by a parallel layer, or None."""
    return getattr(variable, "_mlsl_replicated_in", None)
