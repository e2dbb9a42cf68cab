"""mlsl_tf: fast data- and model-parallel training for TensorFlow 2 / Keras 3, a drop-in for
Horovod's TensorFlow API (`import mlsl_tf as hvd`)."""

from mlsl_tf._library import settings
from mlsl_tf.basics import (NotInitializedError, ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                            gloo_built, gloo_enabled, init, is_initialized, local_rank, local_size,
                            mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank, rocm_built,
                            shutdown, size)
from mlsl_tf.compression import Compression
from mlsl_tf.functions import allgather_object, broadcast_object, broadcast_variables
from mlsl_tf.ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allreduce, alltoall, barrier,
                         broadcast, grouped_allreduce, join, reducescatter)

__version__ = "0.1.0"
