// (Host code, no kernels.) The local (device-sum) communicator and, with NCCL, the one-GPU-per-rank communicator.
#include "kernels/communicator.cuh"

#include "kernels/all_reduce.cuh"

#include <algorithm>

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
// Untested in this pass (the GPU machine of the first pass has one GPU): selected only when every rank owns
// its own device. NCCL sums bf16 per hop, so its rounding differs from the local sum by a few bf16 ulps.
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
#endif

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

#ifdef MLA_WITH_NCCL
std::unique_ptr<Communicator> make_nccl_communicator(const std::vector<RankContext*>& ranks) {
  return std::make_unique<NcclCommunicator>(ranks);
}
#endif

}  // namespace mla::cuda
