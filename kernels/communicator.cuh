// How ranks sum their o_partial (the only collective of an MLA layer). Same call for every kind:
//   LocalCommunicator  ranks share devices (more ranks than GPUs, or no NCCL): a device-side sum on each
//                      rank's device; partials on another device arrive by peer copy first.
//   NcclCommunicator   one GPU per rank: ncclAllReduce in one group (compiled only with NCCL).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kernels/rank_context.cuh"

namespace mla::cuda {

struct ReduceBuffers {
  std::vector<const bf16*> partial;  // [tp], each [count] on its rank's device
  std::vector<bf16*> out;            // [tp], each [count] on its rank's device
  int64_t count = 0;
  // Ranks whose partials are summed, 0 .. summed-1 (0: all). 1 plants allreduce-skip (docs/bugs.md): every rank's
  // o is rank 0's o_partial alone.
  int summed = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;
  // Called for rank 0, 1, ..., tp-1 in turn, after every rank's o_proj was enqueued on its stream. When the
  // call for the last rank returns, every rank's stream is ordered after every reduction (a barrier: the next
  // layer may overwrite any partial).
  virtual void all_reduce(int rank, const std::vector<RankContext*>& ranks, const ReduceBuffers& b) = 0;
};

std::unique_ptr<Communicator> make_local_communicator();
#ifdef MLA_WITH_NCCL
// Requires one distinct device per rank.
std::unique_ptr<Communicator> make_nccl_communicator(const std::vector<RankContext*>& ranks);
// One process per rank (`run --rank`): a fresh ncclUniqueId (rank 0 publishes it through the rendezvous file).
std::vector<unsigned char> nccl_unique_id();
// This process's rank `rank` of `world` on rc's device, joined with the id rank 0 made. Gives up after timeout_s
// (EngineError naming the rank and the wait: another process did not join). all_reduce(rank, ranks, b) then
// reads only ranks[rank], b.partial[rank] and b.out[rank]: the other ranks are other processes.
std::unique_ptr<Communicator> make_nccl_process_communicator(RankContext& rc, int rank, int world,
                                                             const std::vector<unsigned char>& id, double timeout_s);
#endif

}  // namespace mla::cuda
