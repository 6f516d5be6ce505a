// How many threads the reference's Eigen GEMMs use: one per physical core (hyperthreads share a core's
// FMA units, so a second thread per core only adds contention to a GEMM). Set once, by the engine.
#pragma once

namespace mla::ref {

// Physical cores this process may run on: the CPUs of its affinity mask, counted once per
// (physical id, core id) pair of /proc/cpuinfo. Falls back to the affinity count, then to 1.
int physical_cores();

// Once per process: Eigen::setNbThreads(physical_cores()), unless OMP_NUM_THREADS is set (then Eigen
// follows it). Returns the thread count Eigen uses.
int set_eigen_threads();

}  // namespace mla::ref
