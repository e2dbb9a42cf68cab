// Checks of the MPI world mlsl_tf finds at init, as pure functions (no <mpi.h>: the caller
// passes MPI's answers in), so they are tested without MPI: the thread level MPI provides and
// whether the launcher started this process in the world MPI reports.
#pragma once

#include <functional>
#include <string>

#include "communicator.h"
#include "status.h"

namespace mlsl {

// MPI's thread levels in the standard's order (MPI_THREAD_SINGLE < ... < MPI_THREAD_MULTIPLE).
enum class ThreadLevel { kSingle = 0, kFunneled = 1, kSerialized = 2, kMultiple = 3 };
const char* ThreadLevelName(ThreadLevel level);

// MPI is initialised on the thread that calls init() and then used by the background thread:
// that needs at least MPI_THREAD_SERIALIZED. `initialised_by_us`: mlsl_tf asked for
// MPI_THREAD_MULTIPLE itself (else mpi4py or the user initialised MPI first).
Status CheckThreadLevel(ThreadLevel provided, bool initialised_by_us);

// A launcher of another MPI (Open MPI's mpirun running a library built against MPICH, or the
// reverse) starts every rank as a singleton: MPI_COMM_WORLD has size 1 while the launcher's
// environment says N, and every rank would train alone. getenv(name) -> value or nullptr.
// `library` is MPI_Get_library_version's first line, for the message.
Status CheckLauncherWorld(int world_size, const std::function<const char*(const char*)>& getenv,
                          const std::string& library);

// Whether a communicator of `size` ranks, with this rank's `topo`, lies on one machine: what
// MpiCommunicator chooses its allreduce by (the ring, and MPI's built-in operations across
// machines), so it must be the same on every rank.
bool OnOneMachine(const Topology& topo, int size);

}  // namespace mlsl
