// Probe records built on a worker thread: core/engine/probe_record_builder.h.
#include "core/engine/probe_record_builder.h"

#include <chrono>
#include <utility>

namespace mla {

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

void ProbeRecordBuilder::push(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    todo_.push_back(std::make_shared<Queued>(Queued{std::move(job)}));
    settled_.store(false, std::memory_order_release);
  }
  queued_.notify_one();
}

void ProbeRecordBuilder::take(std::vector<ProbeRecord>& out, bool wait) {
  if (wait) {
    // The end of a layer's wait is short (the last records' build after the device's last kernels): spinning on
    // `settled_` for a while answers it without waiting for a blocked thread to be woken.
    const auto until = std::chrono::steady_clock::now() + kSpin;
    while (!settled_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (wait) built_.wait(lock, [&] { return settled(); });
  for (auto& rec : done_) out.push_back(std::move(rec));
  done_.clear();
  if (failed_ && !building_) {  // the records before the failed job are out; the jobs queued after it are dropped
    std::exception_ptr e = failed_;
    failed_ = nullptr;
    todo_.clear();
    std::rethrow_exception(e);
  }
}

void ProbeRecordBuilder::clear() {
  std::unique_lock<std::mutex> lock(mu_);
  todo_.clear();
  built_.wait(lock, [&] { return settled(); });  // the job being built, and any pushed meanwhile
  done_.clear();
  failed_ = nullptr;
  settled_.store(settled(), std::memory_order_release);
}

void ProbeRecordBuilder::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    queued_.wait(lock, [&] { return stop_ || (!todo_.empty() && !failed_); });
    if (stop_) return;
    // Every queued job's ship first (on a device they then wait for their kernels there), then the oldest's
    // finish: a job's copies are never held back behind an older job's wait. A job whose ship threw fails when
    // its turn comes; the older ones are finished first.
    std::vector<std::shared_ptr<Queued>> ships;
    for (const auto& q : todo_)
      if (!q->shipped) {
        ships.push_back(q);
        q->shipped = true;
      }
    const std::shared_ptr<Queued> oldest = todo_.front();
    todo_.pop_front();
    building_ = true;
    lock.unlock();
    for (const auto& q : ships) {
      try {
        q->job.ship();
      } catch (...) {
        q->ship_error = std::current_exception();  // read by this thread only
      }
    }
    ProbeRecord rec;
    std::exception_ptr error = oldest->ship_error;
    if (!error) {
      try {
        rec = oldest->job.finish();
      } catch (...) {
        error = std::current_exception();
      }
    }
    lock.lock();
    building_ = false;
    if (error) failed_ = error;  // take() reports it and drops what was queued after it (a device fault is sticky)
    else done_.push_back(std::move(rec));
    // The waits (take, clear) wait for this state only: one wake-up a batch of jobs, not one a record.
    if (settled()) {
      settled_.store(true, std::memory_order_release);
      built_.notify_all();
    }
  }
}

}  // namespace mla
