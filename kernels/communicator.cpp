// (Host code, no kernels.) The local (device-sum) communicator and, with NCCL, the one-GPU-per-rank communicator.
#include "kernels/communicator.cuh"

#include "kernels/all_reduce.cuh"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

namespace mla::cuda {

namespace {

class LocalCommunicator : public Communicator {
 public:
  std::string name() const override { return "local"; }

  void all_reduce(int rank, const std::vector<RankContext*>& ranks, const ReduceBuffers& b) override {
    const int tp = static_cast<int>(ranks.size());
    if (tp > kMaxRanks) throw EngineError("all_reduce: tp " + std::to_string(tp) + " > " + std::to_string(kMaxRanks));
    if (rank == 0)  // every partial is enqueued by now: mark it on each rank's stream
      for (auto* r : ranks) {
        DeviceGuard g(r->device());
        CUDA_CHECK(cudaEventRecord(r->ready_event(), r->stream()));
      }
    RankContext& me = *ranks[rank];
    DeviceGuard g(me.device());
    PartialList parts;
    parts.count = b.summed > 0 ? std::min(b.summed, tp) : tp;
    for (int q = 0; q < parts.count; ++q) {
      CUDA_CHECK(cudaStreamWaitEvent(me.stream(), ranks[q]->ready_event(), 0));
      if (ranks[q]->device() == me.device()) {
        parts.p[q] = b.partial[q];
      } else {
        bf16* staged = me.scratch_as<bf16>("all_reduce.peer" + std::to_string(q), b.count);
        CUDA_CHECK(cudaMemcpyPeerAsync(staged, me.device(), b.partial[q], ranks[q]->device(), b.count * sizeof(bf16),
                                       me.stream()));
        parts.p[q] = staged;
      }
    }
    launch_sum_partials(parts, b.out[rank], b.count, me.stream());
    CUDA_CHECK(cudaEventRecord(me.done_event(), me.stream()));
    if (rank == tp - 1)  // barrier: nothing after this on any stream may overwrite a partial still being read
      for (auto* r : ranks) {
        DeviceGuard gr(r->device());
        for (auto* q : ranks) CUDA_CHECK(cudaStreamWaitEvent(r->stream(), q->done_event(), 0));
      }
  }
};

#ifdef MLA_WITH_NCCL
// Selected when every rank owns its own device (one process drives them all). NCCL sums bf16 per hop, so its rounding differs from the local sum by a few bf16 ulps.
class NcclCommunicator : public Communicator {
 public:
  explicit NcclCommunicator(const std::vector<RankContext*>& ranks) {
    std::vector<int> devs;
    for (auto* r : ranks) devs.push_back(r->device());
    comms_.resize(ranks.size());
    NCCL_CHECK(ncclCommInitAll(comms_.data(), static_cast<int>(devs.size()), devs.data()));
  }
  ~NcclCommunicator() override {
    for (auto c : comms_) ncclCommDestroy(c);
  }
  std::string name() const override { return "nccl"; }

  void all_reduce(int rank, const std::vector<RankContext*>& ranks, const ReduceBuffers& b) override {
    if (rank != 0) return;  // one group for all ranks, issued once every partial is enqueued
    const int tp = static_cast<int>(ranks.size());
    if (b.summed > 1 && b.summed < tp)
      throw EngineError("all_reduce (nccl): summing " + std::to_string(b.summed) + " of " + std::to_string(tp) +
                        " ranks is not supported");
    NCCL_CHECK(ncclGroupStart());
    for (size_t q = 0; q < ranks.size(); ++q) {
      if (b.summed == 1)  // rank 0's partial alone, to every rank
        NCCL_CHECK(ncclBroadcast(b.partial[q], b.out[q], static_cast<size_t>(b.count), ncclBfloat16, 0, comms_[q],
                                 ranks[q]->stream()));
      else
        NCCL_CHECK(ncclAllReduce(b.partial[q], b.out[q], static_cast<size_t>(b.count), ncclBfloat16, ncclSum,
                                 comms_[q], ranks[q]->stream()));
    }
    NCCL_CHECK(ncclGroupEnd());
  }

 private:
  std::vector<ncclComm_t> comms_;
};

// One rank of a communicator spread over processes. Created non-blocking, so that a process that never joins
// is a timeout with a message rather than a hang; each call then waits until NCCL has taken it.
class NcclProcessCommunicator : public Communicator {
 public:
  NcclProcessCommunicator(RankContext& rc, int rank, int world, const std::vector<unsigned char>& id, double timeout_s)
      : rank_(rank), world_(world) {
    ncclUniqueId uid;
    if (id.size() != sizeof(uid.internal))
      throw EngineError("nccl: communicator id of " + std::to_string(id.size()) + " bytes, expected " +
                        std::to_string(sizeof(uid.internal)));
    std::memcpy(uid.internal, id.data(), id.size());
    DeviceGuard g(rc.device());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, world, uid, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) NCCL_CHECK(r);
    wait("joining the communicator of " + std::to_string(world) + " processes (another rank did not start, or "
         "started with another --rendezvous file?)", timeout_s);
  }
  ~NcclProcessCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
  }
  std::string name() const override { return "nccl-process"; }

  void all_reduce(int rank, const std::vector<RankContext*>& ranks, const ReduceBuffers& b) override {
    if (rank != rank_) throw EngineError("nccl: all_reduce for rank " + std::to_string(rank) + " in the process of rank " +
                                         std::to_string(rank_));
    if (b.summed > 1 && b.summed < world_)
      throw EngineError("all_reduce (nccl): summing " + std::to_string(b.summed) + " of " + std::to_string(world_) +
                        " ranks is not supported");
    RankContext& me = *ranks.at(rank);
    DeviceGuard g(me.device());
    ncclResult_t r;
    if (b.summed == 1)  // rank 0's partial alone, to every rank
      r = ncclBroadcast(b.partial[rank], b.out[rank], static_cast<size_t>(b.count), ncclBfloat16, 0, comm_, me.stream());
    else
      r = ncclAllReduce(b.partial[rank], b.out[rank], static_cast<size_t>(b.count), ncclBfloat16, ncclSum, comm_,
                        me.stream());
    if (r != ncclSuccess && r != ncclInProgress) NCCL_CHECK(r);
    wait("enqueueing the all-reduce", 300);  // host-side only: the collective itself runs on the stream
  }

 private:
  void wait(const std::string& what, double timeout_s) {
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) NCCL_CHECK(state);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited > timeout_s) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw EngineError("nccl: rank " + std::to_string(rank_) + " of " + std::to_string(world_) + " gave up " + what +
                          " after " + std::to_string(static_cast<int>(waited)) + " s");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0, world_ = 1;
};
#endif

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

#ifdef MLA_WITH_NCCL
std::unique_ptr<Communicator> make_nccl_communicator(const std::vector<RankContext*>& ranks) {
  return std::make_unique<NcclCommunicator>(ranks);
}

std::vector<unsigned char> nccl_unique_id() {
  ncclUniqueId uid;
  NCCL_CHECK(ncclGetUniqueId(&uid));
  return std::vector<unsigned char>(reinterpret_cast<const unsigned char*>(uid.internal),
                                    reinterpret_cast<const unsigned char*>(uid.internal) + sizeof(uid.internal));
}

std::unique_ptr<Communicator> make_nccl_process_communicator(RankContext& rc, int rank, int world,
                                                             const std::vector<unsigned char>& id, double timeout_s) {
  return std::make_unique<NcclProcessCommunicator>(rc, rank, world, id, timeout_s);
}
#endif

}  // namespace mla::cuda
