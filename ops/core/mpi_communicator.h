// MpiCommunicator: the Communicator over MPI (with mpi_types.h, the only files that include
// <mpi.h>). It is created by the thread that calls init and afterwards used only by the
// runtime's background thread, which owns MPI (MPI is initialised with MPI_THREAD_MULTIPLE when
// mlsl_tf initialises it, so a user's own mpi4py calls on other threads stay legal). It chooses
// no algorithm (operations.h does): its collectives are MPI's nonblocking ones, except the
// all-to-all, which MPICH runs slower than p2p_algorithms.h's rounds of MPI_Isend/MPI_Irecv.
#pragma once

#include <cstdint>
#include <memory>

#include "communicator.h"

namespace mlsl {

// Initialises MPI if nobody has (otherwise duplicates the existing MPI_COMM_WORLD, e.g. when
// the user imported mpi4py first) and returns a communicator over a private duplicate.
Status CreateMpiCommunicator(std::unique_ptr<Communicator>* out);

// Whether MPI has been initialised with MPI_THREAD_MULTIPLE (Horovod's mpi_threads_supported).
bool MpiThreadsSupported();
// The process is exiting after a failure: skip MPI_Finalize at exit, which in MPICH waits for
// every other rank to finalize too (a failed rank would linger until its peers finish).
void SkipFinalizeAtExit();

}  // namespace mlsl
