// parallel_for: the independent pieces of one stage (heads, blocks of query rows) spread over Eigen's threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>

#include <Eigen/Core>

namespace mla::ref {

// body(i) for every i in [0, n), on Eigen's threads (OpenMP), each thread taking the next i when it is done; inside
// (n > 1), Eigen's products run single-threaded. Each i writes its own part of the result, and what it computes does
// not depend on the thread that runs it: the result is the same for any thread count. No exception may leave an
// OpenMP region (the runtime terminates the process): the first one is kept, the i not yet started are skipped, and
// it is rethrown after the loop.
template <class Body>
void parallel_for(int64_t n, const Body& body) {
  std::exception_ptr failed;
  std::atomic<bool> stop{false};
#pragma omp parallel for schedule(dynamic, 1) num_threads(Eigen::nbThreads()) if (n > 1)
  for (int64_t i = 0; i < n; ++i) {
    if (stop.load(std::memory_order_relaxed)) continue;
    try {
      body(i);
    } catch (...) {
#pragma omp critical(mla_parallel_for_failure)
      if (!failed) failed = std::current_exception();
      stop.store(true, std::memory_order_relaxed);
    }
  }
  if (failed) std::rethrow_exception(failed);
}

}  // namespace mla::ref
