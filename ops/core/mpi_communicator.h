// MpiCommunicator: the Communicator over MPI, and the only file that includes <mpi.h>.
// It is created by the thread that calls init and afterwards used only by the runtime's
// background thread, which owns MPI (MPI is initialised with MPI_THREAD_MULTIPLE when mlsl_tf
// initialises it, so a user's own mpi4py calls on other threads stay legal). Allreduces of at
// least MLSL_TF_RING_BYTES among the ranks of one machine run as the ring of p2p_algorithms.h
// (reusing its buffers), and all-to-alls as that file's point-to-point all-to-all, both over
// this communicator's Send/Recv (MPI_Isend/MPI_Irecv); the rest, and every other collective
// across machines, as MPI's nonblocking collectives.
#pragma once

#include <cstdint>
#include <memory>

#include "communicator.h"

namespace mlsl {

// Initialises MPI if nobody has (otherwise duplicates the existing MPI_COMM_WORLD, e.g. when
// the user imported mpi4py first) and returns a communicator over a private duplicate.
// `ring_bytes`: MLSL_TF_RING_BYTES (RuntimeOptions), for it and every communicator split from it.
Status CreateMpiCommunicator(int64_t ring_bytes, std::unique_ptr<Communicator>* out);

// Whether MPI has been initialised with MPI_THREAD_MULTIPLE (Horovod's mpi_threads_supported).
bool MpiThreadsSupported();
// The process is exiting after a failure: skip MPI_Finalize at exit, which in MPICH waits for
// every other rank to finalize too (a failed rank would linger until its peers finish).
void SkipFinalizeAtExit();

}  // namespace mlsl
