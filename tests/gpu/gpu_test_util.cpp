// GPU test machinery (see gpu_test_util.h).
#include "tests/gpu/gpu_test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "harness/run/runner.h"
#include "harness/run/synthetic_inputs.h"
#include "kernels/cuda_engine.h"

namespace mla::gputest {

bool have_gpu() { return cuda_device_count() > 0; }

std::string no_gpu_message() {
  return "no CUDA device visible: GPU test skipped (run it on a GPU machine, e.g. scripts/gpu_check.sh)";
}

std::string Case::describe() const {
  std::ostringstream os;
  os << name << " [model " << model << ", " << mode_name(mode) << ", " << form_name(form) << ", tp " << tp
     << ", tokens " << tokens << " x batch " << batch << ", context {";
  for (size_t i = 0; i < context.size(); ++i) os << (i ? "," : "") << context[i];
  os << "}, layers " << layers << (input_norm ? ", input_norm" : "") << ", seed " << seed
     << (engine_options.empty() ? "" : ", cuda:" + engine_options) << "]";
  return os.str();
}

GpuRun make_run(const Case& c) {
  GpuRun r;
  auto cfg = find_preset(c.model);
  if (!cfg) throw std::runtime_error("no preset " + c.model);
  r.cfg = *cfg;
  if (c.tweak) {
    c.tweak(r.cfg);
    r.cfg.derive();
  }
  r.spec.mode = c.mode;
  r.spec.form = c.form;
  r.spec.tp = c.tp;
  r.spec.tokens = c.tokens;
  r.spec.batch = c.batch;
  r.spec.context = c.context;
  r.spec.layers = c.layers;
  r.spec.input_norm = c.input_norm;
  r.spec.seed = c.seed;
  r.spec.position_offset = c.position_offset;
  r.cfg.validate();
  r.spec.validate(r.cfg);
  r.graph = build_graph(r.cfg, r.spec.graph_shape());
  const bool input_norm = r.spec.graph_shape().input_norm;

  // Weights depend on the config, the layer count and input_norm only; DeepSeek-V3's take seconds to make.
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const std::vector<LayerWeights>>> cache;
  const std::string key = r.cfg.to_json().dump() + "|" + std::to_string(c.layers) + "|" + std::to_string(input_norm);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it == cache.end())
      it = cache.emplace(key, std::make_shared<const std::vector<LayerWeights>>(
                                  synthetic_weights(r.cfg, c.layers, input_norm, /*seed=*/7)))
               .first;
    r.weights = it->second;
  }
  r.inputs = synthetic_inputs(r.cfg, r.spec, *r.weights);
  return r;
}

const ProbeRecord& Capture::at(int layer, const std::string& probe, int rank) const {
  auto it = recs.find({layer, probe, rank});
  if (it == recs.end())
    throw std::runtime_error("capture has no probe " + probe + " (layer " + std::to_string(layer) + ", rank " +
                             std::to_string(rank) + ")");
  return it->second;
}

namespace {
class CaptureSink : public ProbeSink {
 public:
  explicit CaptureSink(Capture& c) : c_(c) {}
  void record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override {
    c_.recs[{layer, spec.name, rank}] = rec;
  }

 private:
  Capture& c_;
};
}  // namespace

Capture capture(Engine& engine, const GpuRun& run, const Capture* isolate,
                const std::function<void(Runner&)>& configure) {
  Capture out;
  CaptureSink sink(out);
  ProbePlan plan;
  plan.level = ProbeLevel::ProbeLevel_full;
  Runner runner(run.cfg, run.spec);
  if (configure) configure(runner);
  Runner::BeforeStage before = nullptr;
  if (isolate) {
    before = [&](Engine& e, const StageSpec& st, int layer, int rank) {
      if (st.stage == Stage::Stage_all_reduce) {
        // The collective reads every rank's partial: give all of them before the first rank's call.
        if (rank == 0)
          for (int q = 0; q < run.spec.tp; ++q) e.upload(q, "o_partial", isolate->at(layer, "o_partial", q).data);
        return;
      }
      for (const auto& name : st.inputs) e.upload(rank, name, isolate->at(layer, name, rank).data);
    };
  }
  runner.run(engine, *run.weights, run.inputs, plan, sink, before);
  return out;
}

namespace {
struct Err {
  double rel = 0;        // ‖a−b‖/‖b‖
  double worst_tok = 0;  // max over tokens of ‖a_t−b_t‖/‖b_t‖
  int64_t worst_tok_at = -1;
  double max_abs = 0;
  int64_t max_at = -1;
};

Err rel_err(const Tensor& a, const Tensor& b) {
  Err e;
  double d2 = 0, b2 = 0;
  const int64_t n = b.numel(), T = b.shape.empty() ? 1 : std::max<int64_t>(b.dim(0), 1), C = n / T;
  for (int64_t t = 0; t < T; ++t) {
    double td = 0, tb = 0;
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i = t * C + c;
      const double d = static_cast<double>(a.data[i]) - b.data[i];
      td += d * d;
      tb += static_cast<double>(b.data[i]) * b.data[i];
      if (!(std::fabs(d) <= e.max_abs)) {  // NaN-aware: a NaN becomes the worst element
        e.max_abs = std::fabs(d);
        e.max_at = i;
      }
    }
    d2 += td;
    b2 += tb;
    const double tr = std::sqrt(td) / std::max(std::sqrt(tb), 1e-30);
    if (!(tr <= e.worst_tok)) {
      e.worst_tok = tr;
      e.worst_tok_at = t;
    }
  }
  e.rel = std::sqrt(d2) / std::max(std::sqrt(b2), 1e-30);
  return e;
}

std::string coords(const std::vector<int64_t>& shape, int64_t flat) {
  if (flat < 0) return "-";
  std::vector<int64_t> idx(shape.size());
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    idx[i] = flat % shape[i];
    flat /= shape[i];
  }
  std::string s = "[";
  for (size_t i = 0; i < idx.size(); ++i) s += (i ? "," : "") + std::to_string(idx[i]);
  return s + "]";
}
}  // namespace

Margin expect_equivalent(const GpuRun& run, const Capture& cuda, const Capture& bf16, const Capture& fp32,
                         const Tolerance& tol, const std::string& what) {
  Margin margin;
  for (int layer = 0; layer < run.spec.layers; ++layer)
    for (const auto& p : run.graph.probes)
      for (int rank = 0; rank < run.spec.tp; ++rank) {
        const Tensor& a = cuda.at(layer, p.name, rank).data;
        const Tensor& n = bf16.at(layer, p.name, rank).data;
        const Tensor& b = fp32.at(layer, p.name, rank).data;
        EXPECT_EQ(a.shape, b.shape) << what << ": probe " << p.name << " rank " << rank;
        if (a.shape != b.shape) continue;
        const auto& rec = cuda.at(layer, p.name, rank);
        EXPECT_EQ(rec.nan, 0) << what << ": layer " << layer << " probe " << p.name << " rank " << rank
                              << " has NaN (an element its kernel never wrote stays NaN-poisoned)";
        EXPECT_EQ(rec.inf, 0) << what << ": layer " << layer << " probe " << p.name << " rank " << rank;
        const Err e = rel_err(a, b), noise = rel_err(n, b);
        const double limit = tol.k * noise.rel + tol.floor;
        const double tok_limit = tol.k * noise.worst_tok + tol.floor;
        std::ostringstream os;
        os << what << ": layer " << layer << " probe " << p.name << " (stage " << stage_name(p.stage) << ") rank "
           << rank << ": rel_l2 " << e.rel << " vs bf16-reference noise " << noise.rel << " (limit " << limit
           << " = " << tol.k << " x noise + " << tol.floor << "); worst token " << e.worst_tok_at << " rel "
           << e.worst_tok << " (limit " << tok_limit << "); max |cuda-ref| " << e.max_abs << " at "
           << coords(b.shape, e.max_at);
        if (e.max_at >= 0)
          os << " (cuda " << a.data[e.max_at] << ", ref " << b.data[e.max_at] << ")";
        EXPECT_LE(e.rel, limit) << os.str();
        EXPECT_LE(e.worst_tok, tok_limit) << os.str();
        const double ratio = std::max(e.rel / limit, e.worst_tok / tok_limit);
        if (!(ratio <= margin.ratio)) {
          margin.ratio = ratio;
          margin.where = "layer " + std::to_string(layer) + " probe " + p.name + " rank " + std::to_string(rank) +
                         " (rel_l2 " + std::to_string(e.rel) + ", bf16 noise " + std::to_string(noise.rel) + ")";
        }
      }
  std::cout << "[ margin   ] " << what << ": worst err/limit " << margin.ratio << " at " << margin.where << "\n";
  return margin;
}

void expect_record_matches_host(const ProbeRecord& rec, const ProbeRecord& host, const std::string& at) {
  EXPECT_EQ(rec.checksum, host.checksum) << at;
  EXPECT_EQ(rec.nan, host.nan) << at;
  EXPECT_EQ(rec.inf, host.inf) << at;
  EXPECT_EQ(rec.absmax, host.absmax) << at;
  EXPECT_EQ(rec.shape, host.shape) << at;
  // Within 1e-6 of `scale`: the device sums a row's 64 values of a whole step (the tile kernel,
  // kernels/probe_tiles.cu; 32 of a half step in a segment's last partial step and where heads are an odd number of
  // 32-column halves; the row kernel sums in double) on the tensor cores in fp32 — up to four mma k-steps, each
  // adding 16 exact bf16 products to the accumulator and rounding once, so within ~4·2^-23 (4.8e-7) of the sum of their
  // magnitudes — then adds the steps, the rows and (where a 16-row tile is folded on the device) the tiles in
  // double; the host sums in double, row by row. 1e-6 leaves 2x for the hardware's rounding (truncation, not to
  // nearest); every CudaProbe case passed at it on an H200. A non-finite host value (NaN and Inf propagate into
  // the per-token maps) must match exactly.
  auto near = [](double a, double b, double scale) {
    if (!std::isfinite(b)) return std::isnan(a) == std::isnan(b) && (std::isnan(b) || a == b);
    return std::fabs(a - b) <= 1e-6 * scale + 1e-30;
  };
  EXPECT_TRUE(near(rec.l2, host.l2, host.l2)) << at << ": l2 " << rec.l2 << " vs host " << host.l2;
  const double spread = host.std + std::fabs(host.mean);
  EXPECT_TRUE(near(rec.mean, host.mean, spread)) << at << ": mean " << rec.mean << " vs host " << host.mean;
  EXPECT_TRUE(near(rec.std, host.std, spread)) << at << ": std " << rec.std << " vs host " << host.std;
  ASSERT_EQ(rec.token_l2.size(), host.token_l2.size()) << at;
  ASSERT_EQ(rec.head_l2.size(), host.head_l2.size()) << at;
  ASSERT_EQ(rec.sketch.size(), host.sketch.size()) << at;
  // The device sketch accumulates in fp32 (tensor cores), the host's in double: a sum of `cols` terms in fp32
  // is off by about 2^-24 · sqrt(cols) of the row's L2 (a random walk of roundings); 4x that, or 1e-6.
  const double cols = host.token_l2.empty() ? 1.0 : static_cast<double>(shape_numel(host.shape)) / host.token_l2.size();
  const double sketch_rel = std::max(1e-6, 4.0 * std::sqrt(cols) / 16777216.0);
  for (size_t t = 0; t < host.token_l2.size(); ++t) {
    ASSERT_TRUE(near(rec.token_l2[t], host.token_l2[t], host.token_l2[t]))
        << at << " token " << t << ": " << rec.token_l2[t] << " vs host " << host.token_l2[t];
    const size_t H = host.token_l2.empty() ? 0 : host.head_l2.size() / host.token_l2.size();
    for (size_t h = 0; h < H; ++h)
      ASSERT_TRUE(near(rec.head_l2[t * H + h], host.head_l2[t * H + h],
                       std::isfinite(host.token_l2[t]) ? host.token_l2[t] : std::fabs(host.head_l2[t * H + h])))
          << at << " token " << t << " head " << h << ": " << rec.head_l2[t * H + h] << " vs host "
          << host.head_l2[t * H + h];
    for (int k = 0; k < (host.sketch.empty() ? 0 : kSketchDim); ++k) {
      const double d = rec.sketch[t * kSketchDim + k], e = host.sketch[t * kSketchDim + k];
      ASSERT_TRUE(std::isfinite(e) ? std::fabs(d - e) <= sketch_rel * host.token_l2[t] + 1e-30 : near(d, e, 0))
          << at << " token " << t << " sketch lane " << k << ": " << d << " vs host " << e;
    }
  }
}

void expect_device_probes_match_host(const GpuRun& run, const Capture& cuda) {
  for (const auto& [key, rec] : cuda.recs) {
    const auto& [layer, name, rank] = key;
    const ProbeSpec& p = *run.graph.find(name);
    const ProbeRequest req = make_probe_request(p, run.spec.tp, rank, ProbeLevel::ProbeLevel_full);
    const ProbeRecord host = compute_probe_record(rec.data, rec.dtype, req);
    expect_record_matches_host(rec, host,
                               "layer " + std::to_string(layer) + " probe " + name + " rank " + std::to_string(rank));
  }
}

std::unique_ptr<Engine> cuda_engine(const std::string& options) {
  // Test only: MLA_TEST_CUDA_OPTIONS (comma-separated, e.g. "probe_flag=kernel"; empty items are ignored) is
  // appended to every CUDA engine's options made here (it wins over the same key in `options`), so that a ctest
  // entry (tests/CMakeLists.txt) or scripts/gpu_check.sh runs whole tests with an option. The product reads no such
  // variable.
  std::string all = options;
  if (const char* extra = std::getenv("MLA_TEST_CUDA_OPTIONS"); extra && *extra)
    all += (all.empty() ? "" : ",") + std::string(extra);
  return make_engine(EngineSpec::parse(all.empty() ? "cuda" : "cuda:" + all));
}

std::unique_ptr<Engine> reference_engine(const std::string& precision) {
  return make_engine(EngineSpec::parse("reference:precision=" + precision));
}

CliResult run_cli(const std::string& args) {
  const std::string cmd = std::string(MLA_BINARY) + " " + args + " 2>&1";
  CliResult r;
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), p.get())) r.out += buf.data();
  const int st = pclose(p.release());
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string test_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("mla_gpu_test_" + name + "_" + std::to_string(getpid()));
  std::filesystem::create_directories(d);
  return d.string();
}

}  // namespace mla::gputest
