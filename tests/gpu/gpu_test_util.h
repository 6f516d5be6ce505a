// Shared machinery of the GPU tests: build a run (config, spec, weights, inputs), capture every probe of an
// engine in full, optionally isolating each stage on the reference's exact inputs, and hold the CUDA engine
// against the reference with a tolerance calibrated from the bf16 reference's own rounding noise.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/engine/engine.h"
#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/inputs.h"
#include "core/model/stage_graph.h"
#include "core/model/weights.h"
#include "harness/run/runner.h"
#include "core/probe/probe.h"

namespace mla::gputest {

bool have_gpu();
std::string no_gpu_message();

// Skips the calling test, visibly, on a machine without a CUDA device (CI builds these tests there).
#define MLA_REQUIRE_GPU()                                                   \
  do {                                                                      \
    if (!::mla::gputest::have_gpu()) GTEST_SKIP() << ::mla::gputest::no_gpu_message(); \
  } while (0)

struct Case {
  std::string name;
  std::string model = "tiny";
  Mode mode = Mode::Mode_prefill;
  AttentionForm form = AttentionForm::AttentionForm_mha;
  int tp = 1;
  int tokens = 8;  // new tokens per sequence (s_q in decode)
  int batch = 1;
  std::vector<int> context;
  int layers = 1;
  bool input_norm = false;
  uint64_t seed = 1;
  int position_offset = 0;
  std::function<void(MlaConfig&)> tweak;  // e.g. neox rope, no q LoRA
  std::string engine_options;             // the CUDA engine's, e.g. "mha_kernel=1,mqa_kernel=1" (fallbacks)
  std::string describe() const;
};

struct GpuRun {
  MlaConfig cfg;
  RunSpec spec;
  StageGraph graph;
  std::shared_ptr<const std::vector<LayerWeights>> weights;  // cached across tests (big models are slow to make)
  Inputs inputs;
};
GpuRun make_run(const Case& c);

using Key = std::tuple<int, std::string, int>;  // layer, probe, rank
struct Capture {
  std::map<Key, ProbeRecord> recs;
  const ProbeRecord& at(int layer, const std::string& probe, int rank) const;
};

// Runs `engine` over the whole graph with every probe at full level. With `isolate`, each stage first gets
// its inputs uploaded from that capture (the stage is judged on exactly the reference's inputs).
// `configure`: called on the Runner before the run (e.g. to hand it packed weights).
Capture capture(Engine& engine, const GpuRun& run, const Capture* isolate = nullptr,
                const std::function<void(Runner&)>& configure = nullptr);

// The calibration: for every probe p and rank, err(cuda) = rel_l2(cuda, fp32) must not exceed
// k · rel_l2(bf16 reference, fp32) + floor, and the worst token likewise; no NaN/Inf anywhere (every
// output was poisoned with NaN before its kernel ran, so an unwritten element fails here).
struct Tolerance {
  double k = 4.0;
  double floor = 1e-3;
};
// Whole layers: 4x the bf16 reference's noise (compare's --tol-factor default), and a floor of 2^-10 relative L2
// (a quarter of a bf16 ulp) for probes whose bf16 noise is near zero but whose device rounding order differs.
constexpr Tolerance kLayerTol{4.0, 1.0 / 1024};
// Returns the worst err/limit seen (how much headroom the calibration leaves) and prints it as "[ margin ]".
struct Margin {
  double ratio = 0;  // max over probes, ranks and layers of rel_l2 / limit (< 1 passes)
  std::string where;
};
Margin expect_equivalent(const GpuRun& run, const Capture& cuda, const Capture& bf16, const Capture& fp32,
                         const Tolerance& tol, const std::string& what);

// The device-computed stats and sketches of every record equal the host's compute_probe_record on the
// same (downloaded) data: checksum, NaN/Inf counts and absmax exactly, the rest to 1e-6 relative.
void expect_device_probes_match_host(const GpuRun& run, const Capture& cuda);
// One device record against the host's record of the same data (stats, checksum, maps; the sketch within the
// fp32 accumulation's error; non-finite values exactly).
void expect_record_matches_host(const ProbeRecord& rec, const ProbeRecord& host, const std::string& at);

// The CUDA engine with `options` (e.g. "mha_kernel=1"), and the test-only MLA_TEST_CUDA_OPTIONS from the environment
// after them.
std::unique_ptr<Engine> cuda_engine(const std::string& options = "");
std::unique_ptr<Engine> reference_engine(const std::string& precision);

// `mla-bisect ARGS` (the binary built with these tests), its exit code and its output (stdout and stderr merged).
struct CliResult {
  int code = -1;
  std::string out;
};
CliResult run_cli(const std::string& args);
// A directory under the system's temporary directory, named for `name` and this process; made if missing.
std::string test_dir(const std::string& name);

}  // namespace mla::gputest
