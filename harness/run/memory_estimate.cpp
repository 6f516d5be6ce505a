// Peak memory of a run from its shapes (host and per GPU), what the machine has, and the refusal that names both.
#include "harness/run/memory_estimate.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/model/errors.h"
#include "core/model/stage_graph.h"
#include "reference/stages.h"

namespace mla {

namespace {

constexpr double kFloat = 4.0;

const char* kLowerWeights = "--layers (or --layer-range), or a smaller model";
const char* kLowerActivations = "--tokens or --batch";
const char* kLowerScores = "--context or --tokens (a score block is 64 query rows by every key); OMP_NUM_THREADS "
                           "(one block per thread)";
const char* kLowerCache = "--context, --batch or --layers";
const char* kLowerProbes = "--probe-level, --full-probes or --layers";

struct Shapes {
  double T = 0, H = 0, N = 0, Nl = 0, Lq = 0, L = 0, P = 0, R = 0, V = 0, D = 0;
  double tp = 1, layers = 1;
  std::vector<double> ctx, news;  // per sequence
  double num_blocks = 0;
  double layer_weights = 0, sharded_weights = 0;  // floats per layer: all, and the parts split over ranks
};

Shapes shapes_of(const MlaConfig& c, const RunSpec& s) {
  Shapes x;
  x.H = c.hidden, x.N = c.heads, x.Lq = c.q_lora_rank, x.L = c.kv_lora_rank, x.P = c.qk_nope, x.R = c.qk_rope;
  x.V = c.v_head, x.D = c.qk_head();
  x.tp = std::max(1, s.tp), x.layers = std::max(1, s.layers);
  x.Nl = x.N / x.tp;
  const int B = std::max(1, s.batch);
  for (int b = 0; b < B; ++b) {
    const double ctx = s.context.empty() ? 0.0 : s.context.size() == 1 ? s.context[0] : s.context[std::min<size_t>(b, s.context.size() - 1)];
    x.ctx.push_back(ctx);
    x.news.push_back(s.tokens);
    x.T += s.tokens;
    x.num_blocks += std::ceil((ctx + s.tokens) / kPageSize);
  }
  x.num_blocks += 1;
  const double q = x.Lq > 0 ? x.Lq * x.H + x.Lq + x.N * x.D * x.Lq : x.N * x.D * x.H;
  const double kv = (x.L + x.R) * x.H + x.L + x.N * (x.P + x.V) * x.L;
  const double o = x.H * x.N * x.V;
  x.layer_weights = q + kv + o + (s.graph_shape().input_norm ? x.H : 0.0);
  x.sharded_weights = x.N * x.D * (x.Lq > 0 ? x.Lq : x.H) + x.N * (x.P + x.V) * x.L + o;
  return x;
}

// Floats of one rank's copy of every probe tensor of a layer (the engine keeps the latest of each).
double activations_per_rank(const MlaConfig& c, const RunSpec& s) {
  const StageGraph g = build_graph(c, s.graph_shape());
  double n = 0;
  for (const auto& p : g.probes) {
    double e = 1;
    for (int64_t d : local_shape(p, std::max(1, s.tp))) e *= static_cast<double>(d);
    n += e;
  }
  return n;
}

// Floats of the probe records of one layer of one rank, and of its largest stage (the records in flight).
void probe_floats(const MlaConfig& c, const RunSpec& s, const ProbePlan& plan, double& per_layer_rank,
                  double& largest_stage) {
  per_layer_rank = largest_stage = 0;
  if (plan.off) return;
  const StageGraph g = build_graph(c, s.graph_shape());
  for (const auto& st : g.stages) {
    double stage = 0;
    for (const auto& name : st.outputs) {
      const ProbeSpec* p = g.find(name);
      if (!p) continue;
      const auto shape = local_shape(*p, std::max(1, s.tp));
      double numel = 1;
      for (int64_t d : shape) numel *= static_cast<double>(d);
      const double T = shape.empty() ? 1 : static_cast<double>(shape[0]);
      const double heads = p->heads_axis >= 0 ? static_cast<double>(shape[p->heads_axis]) : 0.0;
      const ProbeLevel level = plan.recorded_level(name, static_cast<int64_t>(numel));
      double f = T * (1 + heads);
      if (level >= ProbeLevel::ProbeLevel_sketch) f += T * kSketchDim;
      if (level >= ProbeLevel::ProbeLevel_full) f += numel;
      stage += f;
    }
    per_layer_rank += stage;
    largest_stage = std::max(largest_stage, stage);
  }
}

// Transient floats of one rank's attention stage (the reference: a [min(n, 64), Tk] score block per (head, block of
// query rows) in flight, one per thread, and the copies the stage makes), the largest over the sequences.
double attention_floats(const Shapes& x, AttentionForm form, int threads) {
  double worst = 0;
  for (size_t b = 0; b < x.ctx.size(); ++b) {
    const double n = x.news[b], ctx = x.ctx[b];
    const double rows_in_flight = std::min<double>(n, ref::kAttendRowBlock);  // query rows of one score block
    const double blocks = std::ceil(n / ref::kAttendRowBlock);                  // of one head
    const double th = std::max(1.0, std::min<double>(threads, x.Nl * blocks));
    double f = 0;
    if (form == AttentionForm::AttentionForm_mha) {
      f = th * rows_in_flight * n + 2 * n * x.Nl * x.D + n * x.Nl * x.V;  // self: scores, rows of Q and K, v
      if (ctx > 0)
        f = std::max(f, th * rows_in_flight * (ctx + n) + ctx * x.Nl * (x.P + x.V) + ctx * x.Nl * x.D + 3 * ctx * (x.L + x.R) +
                            2 * n * x.Nl * x.D);
    } else {
      const double rows = ctx + n;
      f = th * rows_in_flight * rows + rows * (2 * x.L + x.R) + n * x.Nl * (x.L + x.R);
    }
    worst = std::max(worst, f);
  }
  const double W = form == AttentionForm::AttentionForm_mha ? 2 * x.D : x.L + x.R;  // the stage's concatenated Q (K)
  return worst + x.T * x.Nl * W;
}

}  // namespace

double MemoryEstimate::total() const {
  double t = 0;
  for (const auto& p : parts) t += p.bytes;
  return t;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, bytes < 10 && u > 0 ? "%.1f %s" : "%.0f %s", bytes, units[u]);
  return buf;
}

std::string MemoryEstimate::breakdown() const {
  std::vector<MemoryPart> sorted = parts;
  std::stable_sort(sorted.begin(), sorted.end(), [](const MemoryPart& a, const MemoryPart& b) { return a.bytes > b.bytes; });
  std::string s;
  for (const auto& p : sorted)
    if (p.bytes > 0) s += (s.empty() ? "" : ", ") + p.what + " " + format_bytes(p.bytes);
  return s;
}

MemoryEstimate estimate_host_memory(const MemoryEstimateInput& in) {
  const MlaConfig& c = *in.cfg;
  const RunSpec& s = *in.spec;
  const Shapes x = shapes_of(c, s);
  const bool host_engine = in.engine != "cuda";
  MemoryEstimate e;
  // The loaded weights, the engine's own copy (rounded to its precision) and, at tp > 1, each rank's shard.
  double copies = host_engine ? 2 : 1;
  if (in.quantized) copies += 1;
  e.parts.push_back({"weights", x.layers * (x.layer_weights * copies + (host_engine && x.tp > 1 ? x.sharded_weights : 0)) * kFloat,
                     kLowerWeights});
  // The reference computes every rank here, each holding the latest tensor of every probe; a device engine's
  // activations are on its devices.
  const double act = host_engine ? activations_per_rank(c, s) * x.tp : 0.0;
  e.parts.push_back({"activations", (act + x.T * x.H) * kFloat, kLowerActivations});
  if (host_engine) e.parts.push_back({"attention scores", attention_floats(x, s.form, in.threads) * kFloat, kLowerScores});
  // The inputs' caches, each rank's copy (reference), and the context's hidden states made for them.
  double ctx_total = 0;
  for (double v : x.ctx) ctx_total += v;
  const double cache_layer = x.num_blocks * kPageSize * (x.L + x.R);
  e.parts.push_back({"kv cache", (x.layers * cache_layer * (host_engine ? 1 + x.tp : 1) + ctx_total * (2 * x.H + 3 * (x.L + x.R))) * kFloat,
                     kLowerCache});
  // Records of one stage in flight (and their encoded copy); a dump's records are folded in memory at the end.
  double per_layer_rank = 0, largest = 0;
  probe_floats(c, s, in.plan, per_layer_rank, largest);
  const double ranks_recorded = in.per_process ? 1 : x.tp;
  double probes = 2 * largest * ranks_recorded;
  if (in.dump) probes += 2 * per_layer_rank * ranks_recorded * x.layers;
  e.parts.push_back({"probes", probes * kFloat, kLowerProbes});
  return e;
}

MemoryEstimate estimate_device_memory(const MemoryEstimateInput& in) {
  const MlaConfig& c = *in.cfg;
  const RunSpec& s = *in.spec;
  const Shapes x = shapes_of(c, s);
  constexpr double kHalf = 2.0;  // bf16 on the device
  const double ranks = in.per_process ? 1 : std::ceil(x.tp / std::max(1, in.devices));
  MemoryEstimate e;
  const double w = (x.layer_weights - x.sharded_weights) + x.sharded_weights / x.tp;
  e.parts.push_back({"weights", ranks * x.layers * w * (in.quantized ? 2 * kHalf : kHalf), kLowerWeights});
  e.parts.push_back({"activations", ranks * (activations_per_rank(c, s) + x.T * x.H) * kHalf, kLowerActivations});
  e.parts.push_back({"kv cache", ranks * x.layers * x.num_blocks * kPageSize * (x.L + x.R) * kHalf, kLowerCache});
  double per_layer_rank = 0, largest = 0;
  probe_floats(c, s, in.plan, per_layer_rank, largest);
  e.parts.push_back({"probes", ranks * per_layer_rank * kFloat, kLowerProbes});
  return e;
}

namespace {
// A "Key:   N kB" line of a /proc file, in bytes; -1 when absent.
double proc_kb(const char* file, const char* key) {
  std::ifstream f(file);
  const std::string k = std::string(key) + ":";
  for (std::string line; std::getline(f, line);)
    if (line.rfind(k, 0) == 0) return std::atof(line.c_str() + k.size()) * 1024.0;
  return -1;
}

double read_number(const std::string& path) {
  std::ifstream f(path);
  std::string v;
  if (!(f >> v) || v == "max") return -1;
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  return end && *end == 0 ? d : -1;
}

// The memory cgroup's limit less its usage (v2 at the process's own cgroup, else v1), -1 when unlimited.
double cgroup_free() {
  std::ifstream cg("/proc/self/cgroup");
  std::string rel;
  for (std::string line; std::getline(cg, line);)
    if (line.rfind("0::", 0) == 0) rel = line.substr(3);
  for (const std::string& dir : {"/sys/fs/cgroup" + rel, std::string("/sys/fs/cgroup")}) {
    const double max = read_number(dir + "/memory.max"), cur = read_number(dir + "/memory.current");
    if (max > 0 && cur >= 0) return std::max(0.0, max - cur);
  }
  const double lim = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  const double use = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  if (lim > 0 && lim < 1e18 && use >= 0) return std::max(0.0, lim - use);
  return -1;
}
}  // namespace

MemoryAvailable available_host_memory() {
  MemoryAvailable a;
  const auto consider = [&](double bytes, const std::string& source) {
    if (bytes < 0) return;
    if (a.bytes < 0 || bytes < a.bytes) a = {bytes, source};
  };
  consider(proc_kb("/proc/meminfo", "MemAvailable"), "MemAvailable in /proc/meminfo");
  consider(cgroup_free(), "the memory cgroup's limit less its usage");
  rlimit r{};
  if (getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    consider(std::max(0.0, static_cast<double>(r.rlim_cur) - std::max(0.0, proc_kb("/proc/self/status", "VmSize"))),
             "the address-space limit (ulimit -v) less what is mapped");
  if (getrlimit(RLIMIT_DATA, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    consider(std::max(0.0, static_cast<double>(r.rlim_cur) - std::max(0.0, proc_kb("/proc/self/status", "VmData"))),
             "the data-segment limit (ulimit -d) less what is in use");
  return a;
}

void require_memory(const MemoryEstimate& need, const MemoryAvailable& have, const std::string& what) {
  if (have.bytes < 0 || need.total() <= have.bytes) return;
  const MemoryPart* big = nullptr;
  for (const auto& p : need.parts)
    if (!big || p.bytes > big->bytes) big = &p;
  std::ostringstream m;
  m << "this run needs about " << format_bytes(need.total()) << " of " << what << " and " << format_bytes(have.bytes)
    << " is available (" << have.source << "): " << need.breakdown() << ". Most of it is " << big->what
    << ": lower " << big->lower;
  throw UsageError(m.str());
}

std::string memory_summary(const MemoryEstimate& need, const MemoryAvailable& have) {
  return "the run's estimated peak is " + format_bytes(need.total()) + " (" + need.breakdown() + ")" +
         (have.bytes >= 0 ? ", " + format_bytes(have.bytes) + " available (" + have.source + ")" : std::string());
}

}  // namespace mla
