// (Host code, no kernels.) Probe records built on a worker thread: kernels/probe_builder.cuh.
#include "kernels/probe_builder.cuh"

#include "kernels/probe_capture.cuh"

namespace mla::cuda {

ProbeRecordBuilder::ProbeRecordBuilder() : thread_([this] { work(); }) {}

ProbeRecordBuilder::~ProbeRecordBuilder() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    todo_.clear();
  }
  queued_.notify_all();
  thread_.join();
}

void ProbeRecordBuilder::push(ProbeCapture& capture, int slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    todo_.push_back({&capture, slot, false});
  }
  queued_.notify_one();
}

void ProbeRecordBuilder::take(std::vector<ProbeRecord>& out, bool wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (wait) built_.wait(lock, [&] { return !building_ && (todo_.empty() || failed_); });
  for (auto& rec : done_) out.push_back(std::move(rec));
  done_.clear();
  if (failed_ && !building_) {  // the records before the failed one are out; what was queued after it is dropped
    std::exception_ptr e = failed_;
    failed_ = nullptr;
    todo_.clear();
    std::rethrow_exception(e);
  }
}

void ProbeRecordBuilder::clear() {
  std::unique_lock<std::mutex> lock(mu_);
  todo_.clear();
  built_.wait(lock, [&] { return !building_; });
  done_.clear();
  failed_ = nullptr;
}

void ProbeRecordBuilder::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    queued_.wait(lock, [&] { return stop_ || (!todo_.empty() && !failed_); });
    if (stop_) return;
    // Every queued job's copies first (they wait on the device for their kernels), then the oldest's record: a
    // job's copies are never held back behind an older job's wait.
    std::vector<Job> unshipped;
    for (Job& j : todo_)
      if (!j.shipped) {
        unshipped.push_back(j);
        j.shipped = true;
      }
    const Job job = todo_.front();
    todo_.pop_front();
    building_ = true;
    lock.unlock();
    ProbeRecord rec;
    std::exception_ptr error;
    try {
      for (const Job& j : unshipped) j.capture->ship(j.slot);
      rec = job.capture->finish(job.slot);  // waits for the slot's copies, then builds
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    building_ = false;
    if (error) {
      failed_ = error;  // take() reports it and drops what was queued after it (a device fault is sticky)
    } else {
      done_.push_back(std::move(rec));
    }
    built_.notify_all();
  }
}

}  // namespace mla::cuda
