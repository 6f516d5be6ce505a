// One process per tensor-parallel rank: which rank this process is, of how many, and which GPU
// of its host it takes, from `--rank N|auto` and the launcher's environment (Open MPI, MPICH/Intel MPI, srun, ours).
#pragma once
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace mla {

struct ProcessRank {
  int rank = -1;           // this process's tp rank; -1: every rank in this process (one process drives all)
  int world = 0;           // number of processes (equals --tp)
  int local_rank = 0;      // index among the processes on this host (picks the GPU)
  std::string rendezvous;  // file through which rank 0 publishes the communicator id (harness/run/rendezvous.h)
  double rendezvous_timeout_s = 300;  // how long ranks other than 0 wait for that file
  std::string source;      // where rank and world came from, for messages: "--rank 1", "Open MPI (OMPI_COMM_WORLD_RANK=3)"
  // Filled by the rendezvous (rendezvous_launch): the launch's id, which every rank's dump records so that a set
  // never mixes launches, and the engine's communicator id (ncclUniqueId for cuda; empty for the reference).
  std::string launch_id;
  std::vector<unsigned char> comm_id;
  bool per_process() const { return rank >= 0; }
};

using GetenvFn = std::function<const char*(const char*)>;

// `rank_opt`: "" (one process drives every rank: ProcessRank{}), a rank number, or "auto": the launcher's
// environment, looked up in this order (the first whose rank variable is set wins; MPI before srun, because
// mpirun inside a SLURM allocation inherits SLURM_PROCID=0 in every process):
//   MLA_RANK / MLA_WORLD_SIZE / MLA_LOCAL_RANK                (ours: set them in a shell loop or over ssh)
//   OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_RANK   (Open MPI's mpirun)
//   PMI_RANK / PMI_SIZE / MPI_LOCALRANKID                     (MPICH's and Intel MPI's Hydra)
//   SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID               (srun)
// A number: world = tp, local_rank = MLA_LOCAL_RANK if set, else the rank (processes of one host). A launcher
// without a local-rank variable: local_rank = rank (one host). Throws UsageError naming the option or variable and
// its value when anything does not fit: not a number, rank >= tp, a world size other than tp, no launcher found,
// --rendezvous missing with tp > 1 (or given without --rank).
ProcessRank resolve_process_rank(const std::string& rank_opt, const std::string& rendezvous, int tp,
                                 const GetenvFn& getenv_fn = std::getenv);

// "rank 1 of 2 (Open MPI (OMPI_COMM_WORLD_RANK=1), local rank 1)", or "every rank in this process".
std::string describe_process_rank(const ProcessRank& p);

}  // namespace mla
