// --rank and the launchers' environment variables -> ProcessRank.
#include "core/engine/process_rank.h"

#include <optional>

#include "core/model/errors.h"

namespace mla {

namespace {

struct Launcher {
  const char* name;
  const char* rank_var;
  const char* size_var;
  const char* local_var;
};

// Order matters: the first launcher whose rank variable is set wins (process_rank.h says why).
constexpr Launcher kLaunchers[] = {
    {"MLA_RANK", "MLA_RANK", "MLA_WORLD_SIZE", "MLA_LOCAL_RANK"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"MPICH/Intel MPI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

// A non-negative decimal number, nothing else (no sign, no spaces, no "3abc"); nullopt otherwise.
std::optional<int> parse_count(const std::string& text) {
  if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoi(text);
}

int env_number(const GetenvFn& getenv_fn, const char* var, const std::string& why) {
  const char* v = getenv_fn(var);
  if (!v) throw UsageError(why + ": " + var + " is not set");
  const auto n = parse_count(v);
  if (!n) throw UsageError(why + ": " + var + "='" + v + "' is not a non-negative number");
  return *n;
}

}  // namespace

ProcessRank resolve_process_rank(const std::string& rank_opt, const std::string& rendezvous, int tp,
                                 const GetenvFn& getenv_fn) {
  if (rank_opt.empty()) {
    if (!rendezvous.empty())
      throw UsageError("--rendezvous " + rendezvous + " is only for one process per rank: add --rank N or --rank auto");
    return {};
  }
  if (tp < 1) throw UsageError("--tp " + std::to_string(tp) + " must be at least 1");
  ProcessRank p;
  p.world = tp;
  std::string rank_var;  // what to name in a message about the rank
  if (rank_opt == "auto") {
    const Launcher* found = nullptr;
    for (const auto& l : kLaunchers)
      if (getenv_fn(l.rank_var)) {
        found = &l;
        break;
      }
    if (!found) {
      std::string vars;
      for (const auto& l : kLaunchers) vars += std::string(vars.empty() ? "" : ", ") + l.rank_var;
      throw UsageError("--rank auto: no launcher's rank variable is set (looked for " + vars +
                       "); launch under mpirun or srun, set MLA_RANK and MLA_WORLD_SIZE, or pass --rank N");
    }
    const std::string why = "--rank auto (" + std::string(found->name) + ")";
    p.rank = env_number(getenv_fn, found->rank_var, why);
    rank_var = std::string(found->rank_var) + "=" + std::to_string(p.rank);
    const int world = env_number(getenv_fn, found->size_var, why);
    if (world != tp)
      throw UsageError(why + ": " + found->size_var + "=" + std::to_string(world) + " processes but --tp is " +
                       std::to_string(tp) + ": launch exactly one process per tensor-parallel rank (e.g. mpirun -np " +
                       std::to_string(tp) + ")");
    p.local_rank = getenv_fn(found->local_var) ? env_number(getenv_fn, found->local_var, why) : p.rank;
    p.source = std::string(found->name) == found->rank_var ? rank_var : std::string(found->name) + " (" + rank_var + ")";
  } else {
    const auto n = parse_count(rank_opt);
    if (!n) throw UsageError("--rank '" + rank_opt + "' is not a rank number or 'auto'");
    p.rank = *n;
    rank_var = "--rank " + rank_opt;
    p.local_rank = getenv_fn("MLA_LOCAL_RANK") ? env_number(getenv_fn, "MLA_LOCAL_RANK", "--rank " + rank_opt) : p.rank;
    p.source = rank_var;
  }
  if (p.rank >= tp)
    throw UsageError(rank_var + " is not a rank of --tp " + std::to_string(tp) + " (ranks are 0.." +
                     std::to_string(tp - 1) + ")");
  if (tp > 1 && rendezvous.empty())
    throw UsageError(p.source + ": one process per rank at --tp " + std::to_string(tp) +
                     " needs --rendezvous PATH, a file path every process can see (rank 0 publishes the communicator "
                     "id there), fresh for each launch, e.g. /shared/mla-id.$SLURM_JOB_ID");
  p.rendezvous = rendezvous;
  return p;
}

std::string describe_process_rank(const ProcessRank& p) {
  if (!p.per_process()) return "every rank in this process";
  return "rank " + std::to_string(p.rank) + " of " + std::to_string(p.world) + " (" + p.source + ", local rank " +
         std::to_string(p.local_rank) + ")";
}

}  // namespace mla
