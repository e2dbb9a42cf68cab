// The C API that Python (ctypes) calls, and the one place that holds the process's Runtime.
// Functions return 0 on success and -1 on failure, with the message in mlsl_tf_last_error().
#pragma once

#include <memory>

#ifdef __cplusplus
namespace mlsl {
class Runtime;
// The current runtime, or null before init / after shutdown. Kernels hold the shared_ptr
// while they submit, so shutdown never frees a runtime under them.
std::shared_ptr<Runtime> CurrentRuntime();
}  // namespace mlsl
extern "C" {
#endif

int mlsl_tf_init(void);
int mlsl_tf_shutdown(void);
int mlsl_tf_is_initialized(void);
int mlsl_tf_rank(void);
int mlsl_tf_size(void);
int mlsl_tf_local_rank(void);
int mlsl_tf_local_size(void);
int mlsl_tf_cross_rank(void);
int mlsl_tf_cross_size(void);
int mlsl_tf_is_homogeneous(void);  // 1 when every machine runs the same number of ranks
int mlsl_tf_mpi_threads_supported(void);
// The process is exiting with an error: at exit, skip MPI_Finalize (it would wait for the other
// ranks), so the launcher sees this rank end now and stops the job.
int mlsl_tf_exit_failing(void);
const char* mlsl_tf_last_error(void);
// The StatusCode (ops/core/status.h) of that failure: 5 (kUnavailable) when a peer rank's end
// caused it; failures outside a collective (init, use before init) give 2 (kFailedPrecondition).
int mlsl_tf_last_error_code(void);
// The runtime's counters as JSON; null (with last_error) before init.
const char* mlsl_tf_stats_json(void);

// Results of started collectives not yet taken (deferred updates); 0 before init.
int mlsl_tf_parked(void);
// Pins the background thread to CPU `core` (init() passes MLSL_TF_COMM_CORE's core for this
// local rank; the core never reads that setting itself).
int mlsl_tf_pin_background_thread(int core);

// Groups. Collective over every rank, in the same order everywhere. add_group returns the new
// group's id (>= 1; 0 is the world) or -1; remove_group returns 0 or -1.
int mlsl_tf_add_group(const int* ranks, int n);
int mlsl_tf_remove_group(int id);

// Horovod's start_timeline / stop_timeline (runtime.h). start: 0; -1 before init; -2 when the
// file cannot be written (*os_error: errno; the message in mlsl_tf_last_error()). stop: 0, or
// -1 before init.
int mlsl_tf_start_timeline(const char* path, int mark_cycles, int* os_error);
int mlsl_tf_stop_timeline(void);

int mlsl_tf_setting_count(void);
const char* mlsl_tf_setting_name(int i);
const char* mlsl_tf_setting_default(int i);
const char* mlsl_tf_setting_doc(int i);
const char* mlsl_tf_setting_allowed(int i);  // what the setting accepts, in words
const char* mlsl_tf_setting_alias(int i);    // another variable read for it ("" = none)

#ifdef __cplusplus
}
#endif
