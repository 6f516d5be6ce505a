// The CUDA engine: per-rank device state (kernels/rank_context.cuh), stage dispatch to one launcher per
// stage (kernels/<stage>.cuh), bf16 activations and weights with fp32 accumulation, device-side probes.
//
// Options (--engine cuda:key=value,...):
//   sync_debug=0|1   synchronize after every stage, so a device fault names its stage (default 0)
//   poison=0|1       fill every stage output with NaN (0xFF bytes) before its kernel writes it (default 1):
//                    an element a kernel forgot to write shows up as a NaN count in the probe
//   comm=auto|local|nccl   how all_reduce sums the ranks' o_partial (auto: nccl when built with NCCL and
//                    every rank has its own GPU, else local)
//   probe=device|host     where probe statistics and sketches are computed (default device)
//   probe_stream=rank|side  device probes' kernels on the rank's stream, in order with its stages (default), or
//                    on a side stream beside the rank's next stages, a stage's (or a layer's held) probes together
//                    after an event (measured on an H200, DeepSeek-V3 at sketch level, a run of 8 layers against
//                    the rank's stream in the same call: T = 4096 +48% against +18%, T = 512 +89% against +64%: the
//                    probe kernels slow the stages they share SMs with by more than they overlap)
//   probe_pdl=0|1    device probes' tile kernels launched as programmatic dependents of the stage before them on
//                    compute capability 9 and later (1, default: their launch overlaps the end of that stage), or
//                    plainly (0)
//   probe_launch=layer|attention|stage  device probes of tensors of at most probe_hold_rows rows held and launched
//                    together (flush_probes), a batch launch for up to 22 tensors and one copy of a rank's results
//                    (at decode the launches, not the bytes, are the cost): all at the end of the layer (layer,
//                    default), or those of the stages before the attention just before it and the rest at the end
//                    (attention: the first batch's copy and records overlap the attention, but its kernels and copy
//                    delay it by about what they save in the tail: decode B 64 on an H200 +15% / +21% at stats /
//                    sketch against +14% / +18%); or each launched after its stage (stage: a device fault then keeps
//                    the records of the stages before it in its layer too)
//   probe_copy=side|rank  where a held layer's records are copied back to the host: on the copy stream after an
//                    event, beside the next layer's first stages (side, default: the copy is off the device's path;
//                    a device fault in the next layer's first ~0.02 ms can then stop it, losing that layer's records
//                    as well as its own), or on the rank's stream behind the probe kernels, ahead of the next layer
//                    (rank: a fault in a later layer never stops it; DeepSeek-V3 decode B 64 on an H200, a run of 8
//                    layers at stats / sketch: +15% / +22% against +10% / +17% with side)
//   probe_hold_rows=N  the most token rows of a tensor whose probe is held (default 256: larger ones are launched
//                    after their stage, where their results' copies overlap the next stages)
//   probe_batch=stage|attention|probe  device probes launched after their stage (not held): a stage's probes
//                    together (stage, default: one batch launch for the tensors of fewer 16-row tiles than the GPU
//                    has SMs, one copy of their results on the copy stream); those of the stages before the
//                    attention together when it begins, the later ones by stage (attention: fewer, larger launches,
//                    whose copy overlaps the attention; a device fault before the attention then loses its layer's
//                    earlier records, as with held probes); or each probe's kernels and copy on their own (probe)
//   probe_flag=memop|kernel  how a device probe's copies are marked done in mapped host memory: a stream memory
//                    operation (memop, default; no SM needed), or a one-thread kernel (kernel; also taken where
//                    the driver lacks the memory operation)
//   devices=N        use the first N visible GPUs (default: all); rank r runs on device r % N
//   mha_kernel=1|2|3|4 attention_mha version: 4 flash on Hopper's wgmma with TMA loads (default; an sm_90 GPU,
//                    an sm_90a build and D/V 192/128 or 256/256, else version 3), 3 flash with 256-row blocks
//                    and 32 rows per warp (for D ≤ 192 / V ≤ 128, wider heads run version 2's wide kernel),
//                    2 flash with 128-row blocks, 1 the simple core; DSA (GLM-5) prefill runs versions 2-4 with
//                    its top-k as a bitmap mask, and 1 as a gather kernel over the selected keys
//   mqa_kernel=auto|1|2|3  attention_mqa version: 3 split-KV on Hopper's wgmma with TMA loads (an sm_90 GPU and
//                    an sm_90a build), 2 the same plan on mma.sync, 1 the simple core; auto (default): 3 where it
//                    can run, else 2. DSA decode runs its sparse kernel whatever the version.
//   head_split=gemm|copy  how q_b_proj and kv_b_proj write their per-head parts (q_nope | q_pe, k_nope | v): a
//                    GEMM per part batched over the heads, each head's rows written where they belong (gemm,
//                    default), or one GEMM into a scratch followed by a per-head copy (copy: the plain way, which
//                    reads and writes the whole output once more)
//
// Planted bugs (--inject, docs/bugs.md): every entry that applies to a GPU path and needs no quantized weights is
// planted in this engine's own computation — a wrong constant, a wrong flag or index of a kernel, a wrong
// shard — the same bug the reference plants, never a copy of the reference's result (see planted() below).
// nan-at, hang-at and crash-at are applied by the Runner, fault-at by run_stage. The quantized-weight entries act
// when the packed weights are dequantized on the device (kernels/dequant.cu), as the reference's act in its
// dequantization.
#include "kernels/cuda_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>

#include "core/engine/probe_record_builder.h"
#include "core/model/errors.h"
#include "kernels/all_reduce.cuh"
#include "kernels/attention_mha.cuh"
#include "kernels/attention_mqa.cuh"
#include "kernels/attention_sparse.cuh"
#include "kernels/bench_ceilings.cuh"
#include "kernels/cache_write.cuh"
#include "kernels/communicator.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/dequant.cuh"
#include "kernels/device_fault.cuh"
#include "kernels/dsa_indexer.cuh"
#include "kernels/kv_a_proj.cuh"
#include "kernels/kv_b_proj.cuh"
#include "kernels/o_proj.cuh"
#include "kernels/probe_capture.cuh"
#include "kernels/probe_stats.cuh"
#include "kernels/q_a_proj.cuh"
#include "kernels/q_absorb.cuh"
#include "kernels/q_b_proj.cuh"
#include "kernels/rank_context.cuh"
#include "kernels/residual.cuh"
#include "kernels/rms_norm.cuh"
#include "kernels/rope.cuh"
#include "kernels/v_up.cuh"

namespace mla {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

namespace {

using cuda::bf16;
using cuda::DeviceBuffer;
using cuda::DeviceGuard;
using cuda::DeviceTensor;
using cuda::DType;
using cuda::RankContext;

bool parse_bool(const std::string& key, const std::string& v) {
  if (v == "1" || v == "true" || v == "on") return true;
  if (v == "0" || v == "false" || v == "off") return false;
  throw UsageError("cuda engine: option " + key + "=" + v + " is not a boolean (expected 0 or 1)");
}

// The weights of one layer as one rank holds them, bf16 on its device.
struct DeviceLayerWeights {
  DeviceTensor input_norm, q_a_proj, q_a_norm, q_b_proj, kv_a_proj, kv_a_norm, kv_b_proj, o_proj;
  DeviceTensor idx_wq_b, idx_wk, idx_k_norm, idx_k_norm_bias, idx_weights_proj;  // DSA's indexer (replicated)
};

struct RankState {
  std::unique_ptr<RankContext> ctx;
  std::map<std::string, DeviceTensor> tensors;  // by probe name, this rank's shard
  std::vector<DeviceTensor> cache;              // per layer [blocks, 64, L+R] (replicated: each rank its own)
  std::vector<DeviceTensor> index_cache;        // DSA: per layer [blocks, 64, Di]
  std::vector<DeviceLayerWeights> weights;      // per layer, sharded for this rank
  DeviceBuffer inv_freq;                        // double [R/2]
  // Planted bugs only (empty otherwise): rope positions off by one (position-offset), the block table as a
  // decode kernel reading block_table[b][j+1] for j >= 1 sees it (page-off-by-one), the layer whose cache was
  // snapshotted before cache_write (decode-empty-cache; the snapshot is the scratch "bug.cache_before_write").
  DeviceBuffer bug_positions;
  DeviceBuffer bug_block_table;
  int bug_snapshot_layer = -1;
};

// The injections this engine plants itself (docs/bugs.md). The quantized-weight bugs (fp8-scale-transpose,
// nvfp4-*) act in the dequantization kernels (kernels/dequant.cu) on packed weights, outside this list.
const std::vector<std::string>& cuda_injections() {
  static const std::vector<std::string> names = {
      "rope-neox",      "rope-mscale",   "position-offset", "softmax-scale", "causal-off",
      "kv-b-split",     "kv-norm-skip",  "q-norm-eps",      "tp-head-offset", "allreduce-skip",
      "wuk-transpose",  "lse-base2",     "page-off-by-one", "decode-empty-cache", "residual-drop",
      "kv-norm-no-weight", "q-norm-width", "o-proj-half-heads", "v-up-head", "kv-norm-weight-wrap", "kv-a-rows-tile",
      "sliding-window", "index-rope-layout", "index-k-norm-skip", "index-weights-skip", "index-causal-leak",
      "topk-off-by-one"};
  return names;
}

class CudaEngine : public Engine, public EngineTiming {
 public:
  explicit CudaEngine(const std::map<std::string, std::string>& options) {
    for (auto& [k, v] : options) {
      if (k == "sync_debug") sync_debug_ = parse_bool(k, v);
      else if (k == "poison") poison_ = parse_bool(k, v);
      else if (k == "comm") {
        if (v != "auto" && v != "local" && v != "nccl")
          throw UsageError("cuda engine: comm=" + v + " (expected auto, local or nccl)");
#ifndef MLA_WITH_NCCL
        if (v == "nccl") throw UsageError("cuda engine: comm=nccl, but this build has no NCCL");
#endif
        comm_opt_ = v;
      } else if (k == "probe") {
        if (v != "device" && v != "host") throw UsageError("cuda engine: probe=" + v + " (expected device or host)");
        device_probes_ = v == "device";
      } else if (k == "probe_stream") {
        if (v != "side" && v != "rank")
          throw UsageError("cuda engine: probe_stream=" + v + " (expected side or rank)");
        probe_side_stream_ = v == "side";
      } else if (k == "probe_pdl") {
        probe_pdl_ = parse_bool(k, v);
      } else if (k == "probe_flag") {
        if (v != "memop" && v != "kernel")
          throw UsageError("cuda engine: probe_flag=" + v + " (expected memop or kernel)");
        probe_flag_kernel_ = v == "kernel";
      } else if (k == "probe_copy") {
        if (v != "side" && v != "rank") throw UsageError("cuda engine: probe_copy=" + v + " (expected side or rank)");
        probe_copy_side_ = v == "side";
      } else if (k == "probe_launch") {
        if (v != "attention" && v != "layer" && v != "stage")
          throw UsageError("cuda engine: probe_launch=" + v + " (expected layer, attention or stage)");
        probe_at_layer_end_ = v != "stage";
        probe_before_attention_ = v == "attention";
      } else if (k == "probe_hold_rows") {
        try {
          held_rows_max_ = std::stoll(v);
        } catch (...) {
          held_rows_max_ = -1;
        }
        if (held_rows_max_ < 0) throw UsageError("cuda engine: probe_hold_rows=" + v + " (expected a row count)");
      } else if (k == "probe_batch") {
        if (v != "stage" && v != "attention" && v != "probe")
          throw UsageError("cuda engine: probe_batch=" + v + " (expected stage, attention or probe)");
        probe_batch_ = v == "stage"       ? ProbeBatch::kStage
                       : v == "attention" ? ProbeBatch::kAttention
                                          : ProbeBatch::kProbe;
      } else if (k == "devices") {
        try {
          devices_opt_ = std::stoi(v);
        } catch (...) {
          devices_opt_ = -1;
        }
        if (devices_opt_ <= 0) throw UsageError("cuda engine: devices=" + v + " (expected a positive count)");
      } else if (k == "mha_kernel" || k == "mqa_kernel") {
        if (k == "mqa_kernel" && v == "auto") {
          mqa_kernel_ = 0;
        } else {
          const bool ok = v == "1" || v == "2" || v == "3" || (k == "mha_kernel" && v == "4");
          if (!ok)
            throw UsageError("cuda engine: " + k + "=" + v +
                             (k == "mha_kernel" ? " (expected 1, 2, 3 or 4)" : " (expected auto, 1, 2 or 3)"));
          (k == "mha_kernel" ? mha_kernel_ : mqa_kernel_) = v[0] - '0';
        }
      } else if (k == "head_split") {
        if (v != "gemm" && v != "copy")
          throw UsageError("cuda engine: head_split=" + v + " (expected gemm or copy)");
        head_split_copy_ = v == "copy";
      } else {
        throw UsageError("cuda engine: unknown option '" + k +
                         "' (known: sync_debug=0|1, poison=0|1, comm=auto|local|nccl, probe=device|host, "
                         "probe_stream=side|rank, probe_pdl=0|1, probe_flag=memop|kernel, "
                         "probe_launch=layer|attention|stage, probe_hold_rows=N, probe_batch=stage|attention|probe, "
                         "devices=N, mha_kernel=1|2|3|4, "
                         "mqa_kernel=auto|1|2|3, head_split=gemm|copy)");
      }
    }
    const int n = cuda_device_count();
    if (devices_opt_ > n)
      throw UsageError("cuda engine: devices=" + std::to_string(devices_opt_) + " but only " + std::to_string(n) +
                       " CUDA device(s) are visible");
    ndev_ = devices_opt_ > 0 ? devices_opt_ : n;
    CUDA_CHECK(cudaGetDeviceProperties(&prop_, 0));
  }

  ~CudaEngine() override {
    comm_.reset();
    builder_.reset();  // before the captures whose slots it finishes
    captures_.clear();
    ranks_.clear();
    for (auto& pool : event_pool_)
      for (cudaEvent_t e : pool) cudaEventDestroy(e);
  }

  std::string name() const override { return "cuda"; }
  std::string options() const override {
    return "comm=" + (comm_ ? comm_->name() : comm_opt_) + ",devices=" + std::to_string(ndev_) +
           ",poison=" + (poison_ ? "1" : "0") + ",probe=" + (device_probes_ ? "device" : "host") +
           ",probe_batch=" + probe_batch_name() + ",probe_copy=" + (probe_copy_side_ ? "side" : "rank") +
           ",probe_flag=" + (probe_flag_kernel_ ? "kernel" : "memop") +
           ",probe_hold_rows=" + std::to_string(held_rows_max_) +
           ",probe_launch=" + (!probe_at_layer_end_ ? "stage" : probe_before_attention_ ? "attention" : "layer") +
           ",probe_pdl=" + (probe_pdl_ ? "1" : "0") +
           ",probe_stream=" + (probe_side_stream_ ? "side" : "rank") +
           ",sync_debug=" + (sync_debug_ ? "1" : "0") + ",mha_kernel=" + std::to_string(mha_kernel_) +
           ",mqa_kernel=" + (mqa_kernel_ == 0 ? std::string("auto") : std::to_string(mqa_kernel_)) +
           ",head_split=" + (head_split_copy_ ? "copy" : "gemm");
  }
  std::string dtype() const override { return "bf16"; }
  DeviceMemory device_memory(int only_device) override {
    DeviceMemory m;
    m.devices = ndev_;
    if (ndev_ <= 0) return m;
    for (int d = 0; d < ndev_; ++d) {
      if (only_device >= 0 && d != only_device % ndev_) continue;
      size_t free = 0, total = 0;
      DeviceGuard g(d);
      if (cudaMemGetInfo(&free, &total) != cudaSuccess) return {ndev_, -1};
      if (m.free_bytes < 0 || static_cast<double>(free) < m.free_bytes) m.free_bytes = static_cast<double>(free);
    }
    return m;
  }
  std::string device() const override {
    return std::string(prop_.name) + (ndev_ > 1 ? " x" + std::to_string(ndev_) : "");
  }

  void set_injections(const std::vector<Injection>& list) override {
    for (const auto& inj : list) {
      if (is_generic_injection(inj) || inj.name == "fault-at") continue;  // fault-at: run_stage plants it
      const auto& ok = cuda_injections();
      if (std::find(ok.begin(), ok.end(), inj.name) != ok.end()) continue;
      const auto* z = find_zoo_entry(inj.name);
      std::string known;
      for (const auto& n : ok) known += " " + n;
      throw UsageError("cuda engine cannot plant '" + inj.name + "'" +
                       (z && z->needs_quantized ? " (it corrupts quantized weights: needs --weight-format)" : "") +
                       " (it plants:" + known + " nan-at hang-at crash-at fault-at)");
    }
    injections_ = list;
  }
  void prepare(const RunContext& ctx) override;
  void run_stage(const StageSpec& stage, int layer, int rank) override;
  Tensor download(int rank, const std::string& name) override;
  const Tensor* weight(int layer, int rank, const std::string& name, Tensor& out) override;
  void upload(int rank, const std::string& name, const Tensor& t) override;
  ProbeRecord probe(int rank, const ProbeSpec& spec, const ProbeRequest& req) override;
  void probe_async(int rank, const ProbeSpec& spec, const ProbeRequest& req) override;
  void collect_probes(std::vector<ProbeRecord>& out, bool wait) override;
  ProbeBuildSeconds probe_build_seconds() const override {
    ProbeBuildSeconds b;
    for (const auto& c : captures_)
      if (c) b.total += c->build_seconds();
    b.last = last_built_ ? last_built_->last_build_seconds() : 0.0;
    return b;
  }
  bool queues_probes() const override { return device_probes_ && !sync_debug_; }
  // When every probe of the run is held (at most probe_hold_rows token rows): a flush queues the kernels of a
  // layer's records on the rank's stream, ahead of the next layer's stages, so nothing there can change what they
  // saw; their copy and flag go on the copy stream beside those stages (probe_copy=side, where a device fault in
  // them can stop the copy), or behind the kernels on the rank's stream (probe_copy=rank, where it cannot). The side
  // stream's kernels run beside the next stages.
  bool pipelines_probes() const override { return holds_probes() && !probe_side_stream_ && T_ <= held_rows_max_; }
  void flush_probes() override;
  bool device_stage(int rank, int& layer, Stage& stage) const override;
  bool owns_rank(int rank) const override { return own_rank_ < 0 || rank == own_rank_; }
#ifdef MLA_WITH_NCCL
  size_t communicator_id_bytes() const override { return 128; }  // sizeof(ncclUniqueId)
  std::vector<unsigned char> make_communicator_id() override { return cuda::nccl_unique_id(); }
#endif
  void synchronize() override {
    launch_staged();
    for (auto& rs : ranks_) {
      if (!rs.ctx) continue;  // another process's rank
      DeviceGuard g(rs.ctx->device());
      CUDA_CHECK(cudaStreamSynchronize(rs.ctx->stream()));
    }
  }
  EngineTiming* timing() override { return this; }
  void set_device_timing(bool on) override {
    timing_ = on;
    timed_.clear();
    for (auto& u : events_used_) u = 0;
  }
  std::vector<StageTiming> take_stage_timings() override;
  bool holds_probes_of(int64_t rows) const override { return holds_probes() && rows <= held_rows_max_; }
  std::vector<DeviceCeiling> measure_ceilings(int repeats) override {
    std::vector<DeviceCeiling> out;
    for (auto& c : cuda::measure_device_ceilings(0, repeats)) out.push_back({c.what, c.flops, c.bytes, c.samples_s});
    return out;
  }

 private:
  void run_stage_impl(const StageSpec& st, int layer, int rank);
  bool planted(const std::string& name) const { return has_injection(injections_, name); }
  DeviceTensor& out(int rank, const std::string& name, std::vector<int64_t> shape, DType dt = DType::DType_bf16);
  // DSA: the rank's topk probe (float key numbers) as the int32 keys the sparse attention kernels read.
  const int* selected_keys(int rank);
  const DeviceTensor& in(int rank, const std::string& name) const;
  DeviceTensor to_device(RankContext& rc, const Tensor& t, DType dt) const;
  std::vector<unsigned char> raw_bytes(int rank, const DeviceTensor& t) const;
  static Tensor to_float(const DeviceTensor& t, const std::vector<unsigned char>& raw);

  bool sync_debug_ = false, poison_ = true, device_probes_ = true, probe_side_stream_ = false;
  bool probe_pdl_ = true, probe_flag_kernel_ = false, probe_copy_side_ = true;
  bool probe_at_layer_end_ = true;      // probe_launch=attention or layer
  enum class ProbeBatch { kStage, kAttention, kProbe };  // probe_batch
  ProbeBatch probe_batch_ = ProbeBatch::kStage;
  const char* probe_batch_name() const {
    return probe_batch_ == ProbeBatch::kStage       ? "stage"
           : probe_batch_ == ProbeBatch::kAttention ? "attention"
                                                    : "probe";
  }
  bool probe_before_attention_ = false;  // probe_launch=attention
  std::string comm_opt_ = "auto";
  int devices_opt_ = 0, ndev_ = 0;
  int mha_kernel_ = 4, mqa_kernel_ = 0;  // mqa 0: auto
  bool head_split_copy_ = false;
  // Device timing (bench): an event pair around each run_stage, from per-rank pools reused between takes.
  struct TimedStage {
    Stage stage;
    int layer, rank;
    cudaEvent_t begin, end;
  };
  cudaEvent_t timing_event(int rank);
  bool timing_ = false;
  std::vector<TimedStage> timed_;
  std::vector<std::vector<cudaEvent_t>> event_pool_;  // per rank, created on the rank's device
  std::vector<size_t> events_used_;
  cudaDeviceProp prop_{};
  RunContext ctx_;
  MlaConfig cfg_;
  int tp_ = 1, T_ = 0;
  int own_rank_ = -1;  // one process per rank: the rank this process drives (-1: every rank)
  std::vector<RankState> ranks_;
  std::unique_ptr<cuda::Communicator> comm_;
  // Device probes (kernels/probe_capture.cuh): one capture per rank; the started ones are built into records on
  // the builder's thread, in call order (core/engine/probe_record_builder.h).
  cuda::ProbeCapture& capture(int rank);
  std::vector<std::unique_ptr<cuda::ProbeCapture>> captures_;
  std::unique_ptr<ProbeRecordBuilder> builder_;
  const cuda::ProbeCapture* last_built_ = nullptr;  // the capture of the last probe started (probe_build_seconds)
  // probe_launch=layer: the probes started since the last flush, in start order, launched by flush_probes; and,
  // per rank, an event after each stage of the layer and of the one before it, whose records the Runner may still
  // await (device_stage: where a hang is). Within a layer no stage writes a tensor another has written, so the held
  // probes see what they would have seen after their stage; a call that would change a held tensor (out, upload)
  // flushes first.
  struct HeldProbe {
    int rank;
    std::string name;
    ProbeRequest req;
  };
  struct BegunStage {
    int layer;
    long nth;  // which layer run of the rank's it is (a bench runs the same layer again and again)
    Stage stage;
    cudaEvent_t done;
  };
  int64_t held_rows_max_ = 256;  // probe_hold_rows
  bool holds_probes() const { return queues_probes() && probe_at_layer_end_; }
  bool held(int rank, const std::string& name) const;
  void start_probe(int rank, const std::string& name, const ProbeRequest& req);
  // probe_batch=stage or attention: the probes started since the last launch that are not held (a stage's, as the
  // Runner starts them after it; with attention, those of the stages before it), launched together by
  // launch_staged before anything else reaches the device or waits: the next stage (with attention: the attention
  // and the stages after it), a collect (with attention: once the attention has begun), a flush, a change to a
  // staged tensor. staged_layer_: the layer of the last stage run; attention_begun_: whether its attention has
  // (note_stage keeps both).
  std::vector<HeldProbe> staged_;
  int staged_layer_ = -1;
  bool attention_begun_ = false;
  void note_stage(const StageSpec& st, int layer);
  // Whether the staged probes go now (at a stage's start, after note_stage, or at a collect).
  bool staged_launch_now() const { return probe_batch_ != ProbeBatch::kAttention || attention_begun_; }
  bool staged(int rank, const std::string& name) const;
  void launch_staged();
  // Starts each rank's probes of `list` (start_many; `beside`: see there) and hands them to the builder in order.
  void start_all(const std::vector<HeldProbe>& list, bool beside);
  static bool listed(const std::vector<HeldProbe>& list, int rank, const std::string& name);
  // Hands a started probe (its capture's slot) to the record builder: its copies, flag and record.
  void build(cuda::ProbeCapture& cap, int slot);
  std::vector<HeldProbe> held_;
  std::vector<std::deque<BegunStage>> begun_;        // per rank: the stages of the current layer and the one before
  std::vector<std::vector<cudaEvent_t>> begun_free_;  // per rank, created on the rank's device, reused
};

DeviceTensor CudaEngine::to_device(RankContext& rc, const Tensor& t, DType dt) const {
  DeviceTensor d;
  d.shape = t.shape;
  d.dtype = dt;
  d.buf = DeviceBuffer(rc.device(), d.bytes());
  if (d.bytes() == 0) return d;
  DeviceGuard g(rc.device());
  if (dt == DType::DType_bf16) {
    std::vector<uint16_t> h(t.data.size());
    const int64_t n = static_cast<int64_t>(h.size());
#pragma omp parallel for schedule(static) if (n > (1 << 20))
    for (int64_t i = 0; i < n; ++i) h[i] = to_bf16_bits(t.data[i]);  // round to nearest even
    CUDA_CHECK(cudaMemcpyAsync(d.buf.get(), h.data(), d.bytes(), cudaMemcpyHostToDevice, rc.stream()));
    CUDA_CHECK(cudaStreamSynchronize(rc.stream()));
  } else {
    CUDA_CHECK(cudaMemcpyAsync(d.buf.get(), t.data.data(), d.bytes(), cudaMemcpyHostToDevice, rc.stream()));
    CUDA_CHECK(cudaStreamSynchronize(rc.stream()));
  }
  return d;
}

// A projection as stored (--weight-format, checkpoints), uploaded packed and dequantized to bf16 on the rank's
// device (kernels/dequant.cu), then cut to the rows or columns head_shards gives the rank. The whole
// tensor is dequantized before slicing: block-quantized formats do not split on block boundaries for every tp
// (a 256-element K-quant block across o_proj's column shards, a 128x128 fp8 scale block across q_b_proj's
// row shards); slicing the exact full result gives each rank exactly the host path's bf16 shard.
DeviceTensor packed_projection(RankContext& rc, const PackedWeight& pw, const std::string& field, const MlaConfig& c,
                               int tp, int rank, const DequantBugs& bugs) {
  DeviceGuard g(rc.device());
  DeviceTensor full = cuda::dequantize_on_device(pw, bugs, DType::DType_bf16, rc.device(), rc.stream());
  if (tp == 1) return full;
  const int64_t Nl = c.heads / tp, D = c.qk_head(), PV = c.qk_nope + c.v_head, V = c.v_head;
  const int64_t R = full.shape[0], C = full.shape[1];
  int64_t r0 = 0, r1 = R, c0 = 0, c1 = C;
  if (field == "q_b_proj") r0 = rank * Nl * D, r1 = (rank + 1) * Nl * D;
  else if (field == "kv_b_proj") r0 = rank * Nl * PV, r1 = (rank + 1) * Nl * PV;
  else if (field == "o_proj") c0 = rank * Nl * V, c1 = (rank + 1) * Nl * V;
  else return full;  // replicated
  if (r1 > R || c1 > C)
    throw UsageError(pw.origin + ": [" + std::to_string(R) + ", " + std::to_string(C) + "] is too small for the " +
                     field + " shard of rank " + std::to_string(rank) + " at tp " + std::to_string(tp));
  DeviceTensor s;
  s.shape = {r1 - r0, c1 - c0};
  s.dtype = DType::DType_bf16;
  s.buf = DeviceBuffer(rc.device(), s.bytes());
  if (s.bytes() > 0)
    CUDA_CHECK(cudaMemcpy2DAsync(s.buf.get(), (c1 - c0) * sizeof(bf16), full.bf() + r0 * C + c0, C * sizeof(bf16),
                                 (c1 - c0) * sizeof(bf16), r1 - r0, cudaMemcpyDeviceToDevice, rc.stream()));
  CUDA_CHECK(cudaStreamSynchronize(rc.stream()));  // `full` is freed on return
  return s;
}

void CudaEngine::prepare(const RunContext& ctx) {
  ctx_ = ctx;
  cfg_ = *ctx.cfg;
  tp_ = ctx.spec->tp;
  T_ = ctx.inputs->batch.tokens();
  if (ndev_ <= 0) throw UsageError("cuda engine: no CUDA device is available");
  if (tp_ > cuda::kMaxRanks)
    throw UsageError("cuda engine: tp " + std::to_string(tp_) + " exceeds " + std::to_string(cuda::kMaxRanks));
  comm_.reset();
  if (builder_) builder_->clear();
  last_built_ = nullptr;
  held_.clear();
  staged_.clear();
  staged_layer_ = -1;
  attention_begun_ = false;
  for (size_t r = 0; r < begun_.size(); ++r) {
    for (const auto& b : begun_[r]) begun_free_[r].push_back(b.done);
    begun_[r].clear();
  }
  captures_.clear();
  ranks_.clear();
  ranks_.resize(tp_);
  // One process per rank (`run --rank`): this process drives its rank alone, on the GPU its local rank picks.
  own_rank_ = ctx.process.per_process() ? ctx.process.rank : -1;
  if (own_rank_ >= tp_)
    throw UsageError("cuda engine: process rank " + std::to_string(own_rank_) + " with tp " + std::to_string(tp_));
  for (int r = 0; r < tp_; ++r)
    if (owns_rank(r))
      ranks_[r].ctx = std::make_unique<RankContext>(r, own_rank_ >= 0 ? ctx.process.local_rank % ndev_ : r % ndev_);

  const auto& graph = *ctx.graph;
  for (int r = 0; r < tp_; ++r) {
    if (!owns_rank(r)) continue;
    auto& rs = ranks_[r];
    RankContext& rc = *rs.ctx;
    DeviceGuard g(rc.device());
    rc.upload_batch(ctx.inputs->batch);
    rs.inv_freq = rc.to_device(cfg_.inv_freq);
    const Batch& batch = ctx.inputs->batch;
    if (planted("position-offset")) {  // positions start at 1 instead of 0
      std::vector<int> pos = batch.positions;
      for (auto& p : pos) p += 1;
      rs.bug_positions = rc.to_device(pos);
    }
    if (planted("page-off-by-one")) {  // entry j >= 1 read from j+1 (while j+1 is inside the row)
      std::vector<int> bt = batch.block_table;
      for (int b = 0; b < batch.num_seqs(); ++b)
        for (int j = 1; j + 1 < batch.max_blocks; ++j)
          bt[b * batch.max_blocks + j] = batch.block_table[b * batch.max_blocks + j + 1];
      rs.bug_block_table = rc.to_device(bt);
    }
    rs.bug_snapshot_layer = -1;
    for (const auto& global : *ctx.weights) {
      // The head-sharded projections by the harness's own head_shards, the definition the reference uses too;
      // the replicated weights read from the global layer.
      LayerWeights shard;
      if (tp_ > 1) shard = head_shards(global, cfg_, tp_, r);
      // tp-head-offset: rank r >= 1 loads the q_b_proj head block of rank r-1 (a wrong shard offset).
      if (tp_ > 1 && r >= 1 && planted("tp-head-offset")) shard.q_b_proj = head_shards(global, cfg_, tp_, r - 1).q_b_proj;
      const LayerWeights& w = global;
      const LayerWeights& heads = tp_ > 1 ? shard : global;
      auto up = [&](const Tensor& t) { return t.empty() ? DeviceTensor{} : to_device(rc, t, DType::DType_bf16); };
      // Projections the run holds packed (RunContext::packed) are dequantized here, the run's bugs applied on
      // the device; the others (and the norms) are the host's FP32 rounded to bf16.
      const size_t layer = rs.weights.size();
      const auto* packed = ctx.packed && layer < ctx.packed->size() ? &(*ctx.packed)[layer] : nullptr;
      auto proj = [&](const std::string& field, const Tensor& t) {
        if (!packed || !packed->count(field)) return up(t);
        const bool wrong_block = field == "q_b_proj" && tp_ > 1 && r >= 1 && planted("tp-head-offset");
        return packed_projection(rc, packed->at(field), field, cfg_, tp_, wrong_block ? r - 1 : r, ctx.dequant_bugs);
      };
      DeviceLayerWeights d;
      d.input_norm = up(w.input_norm);
      d.q_a_proj = proj("q_a_proj", w.q_a_proj);
      d.q_a_norm = up(w.q_a_norm);
      d.q_b_proj = proj("q_b_proj", heads.q_b_proj);
      d.kv_a_proj = proj("kv_a_proj", w.kv_a_proj);
      d.kv_a_norm = up(w.kv_a_norm);
      d.kv_b_proj = proj("kv_b_proj", heads.kv_b_proj);
      d.o_proj = proj("o_proj", heads.o_proj);
      d.idx_wq_b = up(w.idx_wq_b);
      d.idx_wk = up(w.idx_wk);
      d.idx_k_norm = up(w.idx_k_norm);
      d.idx_k_norm_bias = up(w.idx_k_norm_bias);
      d.idx_weights_proj = up(w.idx_weights_proj);
      rs.weights.push_back(std::move(d));
    }
    for (const auto& c : ctx.inputs->kv_cache) rs.cache.push_back(to_device(rc, c, DType::DType_bf16));
    for (const auto& c : ctx.inputs->index_cache) rs.index_cache.push_back(to_device(rc, c, DType::DType_bf16));
    rs.tensors[graph.stages.front().outputs.front()] = to_device(rc, ctx.inputs->x, DType::DType_bf16);
  }

  if (own_rank_ >= 0 && tp_ > 1) {  // the other ranks are other processes: NCCL across them
#ifdef MLA_WITH_NCCL
    if (comm_opt_ == "local")
      throw UsageError("cuda engine: comm=local cannot sum ranks of other processes (run --rank needs NCCL)");
    const ProcessRank& pr = ctx.process;  // comm_id: rank 0's make_communicator_id, through the rendezvous
    if (pr.comm_id.size() != communicator_id_bytes())
      throw EngineError("cuda engine: rank " + std::to_string(pr.rank) + " has a communicator id of " +
                        std::to_string(pr.comm_id.size()) + " bytes (no rendezvous before prepare?)");
    comm_ = cuda::make_nccl_process_communicator(*ranks_[own_rank_].ctx, pr.rank, tp_, pr.comm_id,
                                                 pr.rendezvous_timeout_s);
    return;
#else
    throw UsageError("cuda engine: one process per rank (run --rank) needs NCCL, and this build has none");
#endif
  }
  std::vector<RankContext*> rcs;
  for (auto& rs : ranks_) rcs.push_back(rs.ctx.get());
  bool own_devices = tp_ > 1 && tp_ <= ndev_;
#ifdef MLA_WITH_NCCL
  if (comm_opt_ == "nccl" || (comm_opt_ == "auto" && own_devices)) {
    if (!own_devices && tp_ > 1)
      throw UsageError("cuda engine: comm=nccl needs one GPU per rank (tp " + std::to_string(tp_) + ", " +
                       std::to_string(ndev_) + " device(s))");
    comm_ = cuda::make_nccl_communicator(rcs);
  }
#else
  (void)own_devices;
#endif
  if (!comm_) comm_ = cuda::make_local_communicator();
}

DeviceTensor& CudaEngine::out(int rank, const std::string& name, std::vector<int64_t> shape, DType dt) {
  if (staged(rank, name)) launch_staged();  // their kernels read it before the stage writes it again
  if (held(rank, name)) flush_probes();
  RankContext& rc = *ranks_[rank].ctx;
  DeviceTensor& t = ranks_[rank].tensors[name];
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * cuda::dtype_size(dt);
  if (t.buf.bytes() != bytes || t.buf.device() != rc.device()) {
    CUDA_CHECK(cudaStreamSynchronize(rc.stream()));  // the old buffer may still be read
    t.buf = DeviceBuffer(rc.device(), bytes);
  }
  t.shape = std::move(shape);
  t.dtype = dt;
  if (poison_ && bytes) CUDA_CHECK(cudaMemsetAsync(t.buf.get(), 0xFF, bytes, rc.stream()));
  return t;
}

const int* CudaEngine::selected_keys(int rank) {
  RankContext& rc = *ranks_[rank].ctx;
  const DeviceTensor& t = in(rank, "topk");
  int* keys = rc.scratch_as<int>("dsa.topk_i", t.numel());
  cuda::launch_topk_indices(t.f32(), keys, t.numel(), rc.stream());
  return keys;
}

const DeviceTensor& CudaEngine::in(int rank, const std::string& name) const {
  const auto& m = ranks_.at(rank).tensors;
  auto it = m.find(name);
  if (it == m.end()) throw EngineError("cuda engine: rank " + std::to_string(rank) + " has no tensor '" + name + "'");
  return it->second;
}

void CudaEngine::run_stage(const StageSpec& st, int layer, int rank) {
  if (rank < 0 || rank >= tp_) throw EngineError("cuda engine: rank " + std::to_string(rank) + " out of range");
  // The probes of the stages before (when no collect launched them); a failure there is theirs, not this stage's.
  note_stage(st, layer);
  if (staged_launch_now()) launch_staged();
  try {
    DeviceGuard g(ranks_[rank].ctx->device());
    // probe_launch=attention: the probes held so far go before the attention, so that their copy and records
    // overlap it (before its timing event: their kernels are not the stage's).
    if (probe_before_attention_ && !held_.empty() &&
        (st.stage == Stage::Stage_attention_mha || st.stage == Stage::Stage_attention_mqa))
      flush_probes();
    cudaEvent_t begin = nullptr;
    if (timing_) {
      begin = timing_event(rank);
      CUDA_CHECK(cudaEventRecord(begin, ranks_[rank].ctx->stream()));
    }
    // fault-at: a real device fault (an illegal address) as the stage begins, as a broken kernel of it would make.
    for (const auto& inj : injections())
      if (inj.name == "fault-at" && inj.target == stage_name(st.stage) && (inj.rank < 0 || inj.rank == rank) &&
          (inj.layer < 0 || inj.layer == layer))
        cuda::launch_device_fault(ranks_[rank].ctx->stream());
    run_stage_impl(st, layer, rank);
    if (holds_probes()) {  // where the device is, for a hang seen while the held records wait
      if (static_cast<int>(begun_.size()) <= rank) begun_.resize(rank + 1), begun_free_.resize(rank + 1);
      auto& begun = begun_[rank];
      auto& free = begun_free_[rank];
      long nth = begun.empty() ? 0 : begun.back().nth;
      if (!begun.empty() && (begun.back().layer != layer || st.stage == Stage::Stage_layer_input)) {
        // A layer begins: the stages of the one before it stay (its records may still be awaited, pipelines_probes);
        // those of the layer before that are done with.
        while (!begun.empty() && begun.front().nth != nth) {
          free.push_back(begun.front().done);
          begun.pop_front();
        }
        ++nth;
      }
      if (free.empty()) {
        cudaEvent_t e = nullptr;
        CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        free.push_back(e);
      }
      cudaEvent_t done = free.back();
      free.pop_back();
      CUDA_CHECK(cudaEventRecord(done, ranks_[rank].ctx->stream()));
      begun.push_back({layer, nth, st.stage, done});
    }
    if (timing_) {
      cudaEvent_t end = timing_event(rank);
      CUDA_CHECK(cudaEventRecord(end, ranks_[rank].ctx->stream()));
      timed_.push_back({st.stage, layer, rank, begin, end});
    }
    if (sync_debug_) {
      CUDA_CHECK(cudaGetLastError());
      CUDA_CHECK(cudaStreamSynchronize(ranks_[rank].ctx->stream()));
    }
  } catch (const EngineError& e) {
    throw EngineError(std::string("cuda engine: stage ") + stage_name(st.stage) + " (layer " + std::to_string(layer) +
                      ", rank " + std::to_string(rank) + "): " + e.what());
  }
}

cudaEvent_t CudaEngine::timing_event(int rank) {
  if (static_cast<int>(event_pool_.size()) <= rank) {
    event_pool_.resize(rank + 1);
    events_used_.resize(rank + 1, 0);
  }
  auto& pool = event_pool_[rank];
  if (events_used_[rank] == pool.size()) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreate(&e));  // on the current device: run_stage's guard set the rank's
    pool.push_back(e);
  }
  return pool[events_used_[rank]++];
}

std::vector<StageTiming> CudaEngine::take_stage_timings() {
  synchronize();
  std::vector<StageTiming> out;
  std::map<int, cudaEvent_t> origin;  // per device: the first event recorded there
  for (const auto& t : timed_) {
    const int dev = ranks_.at(t.rank).ctx->device();
    DeviceGuard g(dev);
    if (!origin.count(dev)) origin[dev] = t.begin;
    float a = 0, b = 0;
    CUDA_CHECK(cudaEventElapsedTime(&a, origin[dev], t.begin));
    CUDA_CHECK(cudaEventElapsedTime(&b, origin[dev], t.end));
    out.push_back({t.stage, t.layer, t.rank, a * 1e-3, b * 1e-3, dev});
  }
  timed_.clear();
  for (auto& u : events_used_) u = 0;
  return out;
}

void CudaEngine::run_stage_impl(const StageSpec& st, int layer, int rank) {
  RankState& rs = ranks_[rank];
  RankContext& rc = *rs.ctx;
  const DeviceLayerWeights& W = rs.weights.at(layer);
  cudaStream_t s = rc.stream();
  cublasHandle_t hb = rc.cublas();
  const int64_t T = T_, H = cfg_.hidden, Nl = cfg_.heads / tp_, Lq = cfg_.q_lora_rank, L = cfg_.kv_lora_rank;
  const int64_t P = cfg_.qk_nope, R = cfg_.qk_rope, V = cfg_.v_head;
  const float eps = static_cast<float>(cfg_.rms_eps);
  // Planted bugs that are a wrong constant: the reference plants the same ones.
  const float q_norm_eps = planted("q-norm-eps") ? 1e-5f : eps;
  const float softmax_scale = static_cast<float>(
      planted("softmax-scale") ? 1.0 / std::sqrt(static_cast<double>(cfg_.qk_head())) : cfg_.softmax_scale);
  // DSA's indexer: its heads and lanes, and the positions and frequencies its rope uses (the model's own).
  const int64_t Hi = cfg_.index_n_heads, Di = cfg_.index_head_dim;
  const int* positions = rs.bug_positions.get() ? static_cast<const int*>(rs.bug_positions.get())
                                                : rc.batch().i32(rc.batch().positions);
  const auto* inv_freq = static_cast<const double*>(rs.inv_freq.get());

  switch (st.stage) {
    case Stage::Stage_layer_input: {
      if (layer == 0) break;  // prepare() placed the input
      const DeviceTensor& src = in(rank, "h_out");
      DeviceTensor& dst = out(rank, st.outputs[0], src.shape);
      CUDA_CHECK(cudaMemcpyAsync(dst.buf.get(), src.buf.get(), src.bytes(), cudaMemcpyDeviceToDevice, s));
      break;
    }
    case Stage::Stage_input_norm: {
      const DeviceTensor& h = in(rank, "h");
      DeviceTensor& x = out(rank, "x", {T, H});
      cuda::launch_rms_norm(h.bf(), H, W.input_norm.bf(), x.bf(), T, H, eps, s);
      break;
    }
    case Stage::Stage_q_a_proj: {
      const DeviceTensor& x = in(rank, "x");
      DeviceTensor& q_a = out(rank, "q_a", {T, Lq});
      cuda::launch_q_a_proj(hb, x.bf(), W.q_a_proj.bf(), q_a.bf(), T, H, Lq);
      break;
    }
    case Stage::Stage_q_a_norm: {
      const DeviceTensor& q_a = in(rank, "q_a");
      DeviceTensor& q_c = out(rank, "q_c", {T, Lq});
      // q-norm-width: the mean square over kv_lora_rank channels, the other norm's width.
      cuda::launch_rms_norm(q_a.bf(), Lq, W.q_a_norm.bf(), q_c.bf(), T, Lq, q_norm_eps, s,
                            {.width = planted("q-norm-width") ? L : 0});
      break;
    }
    case Stage::Stage_q_b_proj:
    case Stage::Stage_q_proj: {
      const bool lora = st.stage == Stage::Stage_q_b_proj;
      const DeviceTensor& x = in(rank, lora ? "q_c" : "x");
      DeviceTensor& q_nope = out(rank, "q_nope", {T, Nl, P});
      DeviceTensor& q_pe = out(rank, "q_pe", {T, Nl, R});
      bf16* scratch = head_split_copy_ ? rc.scratch_as<bf16>("q_b_proj.y", T * Nl * (P + R)) : nullptr;
      cuda::launch_q_b_proj(hb, s, x.bf(), W.q_b_proj.bf(), scratch, q_nope.bf(), q_pe.bf(), T, lora ? Lq : H, Nl, P,
                            R, head_split_copy_);
      break;
    }
    case Stage::Stage_kv_a_proj: {
      const DeviceTensor& x = in(rank, "x");
      DeviceTensor& kv_c = out(rank, "kv_c", {T, L});
      DeviceTensor& k_pe = out(rank, "k_pe", {T, R});
      bf16* scratch = rc.scratch_as<bf16>("kv_a_proj.y", T * (L + R));
      // kv-a-rows-tile: the GEMM and its split launched over whole row tiles only, into outputs an allocator zeroed.
      const int64_t M = planted("kv-a-rows-tile") ? T / kRowsTileBug * kRowsTileBug : T;
      if (M < T) {
        CUDA_CHECK(cudaMemsetAsync(kv_c.buf.get(), 0, kv_c.bytes(), s));
        CUDA_CHECK(cudaMemsetAsync(k_pe.buf.get(), 0, k_pe.bytes(), s));
      }
      if (M > 0) cuda::launch_kv_a_proj(hb, s, x.bf(), W.kv_a_proj.bf(), scratch, kv_c.bf(), k_pe.bf(), M, H, L, R);
      break;
    }
    case Stage::Stage_kv_a_norm: {
      const DeviceTensor& kv_c = in(rank, "kv_c");
      DeviceTensor& n = out(rank, "kv_c_norm", {T, L});
      if (planted("kv-norm-skip"))  // kv_a_layernorm skipped: kv_c passed on as it is
        CUDA_CHECK(cudaMemcpyAsync(n.buf.get(), kv_c.buf.get(), kv_c.bytes(), cudaMemcpyDeviceToDevice, s));
      else
        cuda::launch_rms_norm(kv_c.bf(), L, W.kv_a_norm.bf(), n.bf(), T, L, eps, s,
                              {.no_weight = planted("kv-norm-no-weight"),
                               .weight_wrap = planted("kv-norm-weight-wrap") ? L / 2 : 0});
      break;
    }
    case Stage::Stage_rope: {
      // rope-neox: the other pairing of the rope lanes (rotate-half on interleaved, or the reverse).
      const bool neox = (cfg_.rope_style == RopeStyle::RopeStyle_neox) != planted("rope-neox");
      // rope-mscale: cos/sin times get_mscale(s, mscale) instead of the ratio (YaRN models only).
      const double cs_scale = planted("rope-mscale") && cfg_.rope_scaling == RopeScaling::RopeScaling_yarn
                                  ? yarn_get_mscale(cfg_.yarn.factor, cfg_.yarn.mscale)
                                  : cfg_.rope_mscale;
      const int* pos = rs.bug_positions.get() ? static_cast<const int*>(rs.bug_positions.get())
                                        : rc.batch().i32(rc.batch().positions);
      const auto* inv = static_cast<const double*>(rs.inv_freq.get());
      const DeviceTensor& q_pe = in(rank, "q_pe");
      const DeviceTensor& k_pe = in(rank, "k_pe");
      DeviceTensor& q_rot = out(rank, "q_pe_rope", {T, Nl, R});
      DeviceTensor& k_rot = out(rank, "k_pe_rope", {T, R});
      cuda::launch_rope(q_pe.bf(), q_rot.bf(), T, Nl, static_cast<int>(R), pos, inv, cs_scale, neox, s);
      cuda::launch_rope(k_pe.bf(), k_rot.bf(), T, 1, static_cast<int>(R), pos, inv, cs_scale, neox, s);
      break;
    }
    case Stage::Stage_cache_write: {
      const DeviceTensor& kv = in(rank, "kv_c_norm");
      const DeviceTensor& kp = in(rank, "k_pe_rope");
      DeviceTensor& rows = out(rank, "kv_cache", {T, L + R});
      if (planted("decode-empty-cache")) {  // attention will read the cache as it was before this write
        DeviceTensor& cache = rs.cache.at(layer);
        void* snap = rc.scratch("bug.cache_before_write", cache.bytes());
        if (cache.bytes())
          CUDA_CHECK(cudaMemcpyAsync(snap, cache.buf.get(), cache.bytes(), cudaMemcpyDeviceToDevice, s));
        rs.bug_snapshot_layer = layer;
      }
      cuda::launch_cache_write(rs.cache.at(layer).bf(), rows.bf(), kv.bf(), kp.bf(),
                               rc.batch().i64(rc.batch().slot_mapping), T, static_cast<int>(L), static_cast<int>(R), s);
      break;
    }
    case Stage::Stage_indexer_q: {
      // index-rope-layout: the indexer's rope lanes paired as the other DSA model's (interleaved <-> half-split).
      const bool neox = (cfg_.index_rope_style == RopeStyle::RopeStyle_neox) != planted("index-rope-layout");
      DeviceTensor& q = out(rank, "idx_q", {T, Hi, Di});
      cuda::launch_indexer_q(hb, s, in(rank, "q_c").bf(), Lq, W.idx_wq_b.bf(), q.bf(), T, Lq, static_cast<int>(Hi),
                             static_cast<int>(Di), static_cast<int>(R), positions, inv_freq, neox);
      break;
    }
    case Stage::Stage_indexer_k: {
      const bool neox = (cfg_.index_rope_style == RopeStyle::RopeStyle_neox) != planted("index-rope-layout");
      bf16* k_lin = rc.scratch_as<bf16>("indexer_k.lin", T * Di);
      cuda::gemm_xwt(hb, in(rank, "x").bf(), H, W.idx_wk.bf(), k_lin, Di, T, H, Di);
      DeviceTensor& k = out(rank, "idx_k", {T, Di});
      cuda::launch_indexer_k_finish(k_lin, W.idx_k_norm.bf(), W.idx_k_norm_bias.bf(),
                                    static_cast<float>(MlaConfig::kIndexNormEps), positions, inv_freq,
                                    static_cast<int>(R), neox, T, static_cast<int>(Di), k.bf(),
                                    rs.index_cache.at(layer).bf(), rc.batch().i64(rc.batch().slot_mapping), s,
                                    /*norm=*/!planted("index-k-norm-skip"));
      break;
    }
    case Stage::Stage_indexer_weights: {
      DeviceTensor& w = out(rank, "idx_weights", {T, Hi});
      cuda::launch_indexer_weights(hb, in(rank, "x").bf(), H, W.idx_weights_proj.bf(), w.bf(), T, H,
                                   static_cast<int>(Hi));
      break;
    }
    case Stage::Stage_index_scores: {
      const int64_t K = ctx_.graph->find("idx_scores")->shape[1];
      DeviceTensor& sc = out(rank, "idx_scores", {T, K}, DType::DType_f32);
      // index-weights-skip: every head weighs 1; index-causal-leak: the scores' causal mask left off.
      const bf16* w = in(rank, "idx_weights").bf();
      if (planted("index-weights-skip")) {
        bf16* ones = rc.scratch_as<bf16>("bug.index_weights_ones", T * Hi);
        cuda::launch_fill_bf16(ones, T * Hi, 1.0f, s);
        w = ones;
      }
      cuda::launch_index_scores(in(rank, "idx_q").bf(), w, rs.index_cache.at(layer).bf(),
                                rc.batch(), static_cast<int>(T), static_cast<int>(Hi), static_cast<int>(Di),
                                static_cast<int>(K), sc.f32(), !planted("index-causal-leak"), s);
      break;
    }
    case Stage::Stage_topk: {
      const DeviceTensor& sc = in(rank, "idx_scores");
      const int k = cfg_.index_topk;
      DeviceTensor& tk = out(rank, "topk", {T, k}, DType::DType_f32);
      if (planted("topk-off-by-one")) {  // k − 1 keys a token, the last column −1
        float* fewer = rc.scratch_as<float>("bug.topk_fewer", T * (k - 1));
        cuda::launch_topk(sc.f32(), rc.batch(), static_cast<int>(T), static_cast<int>(sc.shape[1]), k - 1,
                          !planted("index-causal-leak"), fewer, nullptr, 0, s);
        cuda::launch_fill_f32(tk.f32(), T * k, -1.0f, s);
        if (k > 1)
          CUDA_CHECK(cudaMemcpy2DAsync(tk.f32(), sizeof(float) * k, fewer, sizeof(float) * (k - 1),
                                       sizeof(float) * (k - 1), T, cudaMemcpyDeviceToDevice, s));
        break;
      }
      cuda::launch_topk(sc.f32(), rc.batch(), static_cast<int>(T), static_cast<int>(sc.shape[1]), k,
                        !planted("index-causal-leak"), tk.f32(), nullptr, 0, s);
      break;
    }
    case Stage::Stage_kv_b_proj: {
      const DeviceTensor& kv = in(rank, "kv_c_norm");
      DeviceTensor& k_nope = out(rank, "k_nope", {T, Nl, P});
      DeviceTensor& v = out(rank, "v", {T, Nl, V});
      const bool by_block = planted("kv-b-split");
      bf16* scratch = head_split_copy_ || by_block ? rc.scratch_as<bf16>("kv_b_proj.y", T * Nl * (P + V)) : nullptr;
      cuda::launch_kv_b_proj(hb, s, kv.bf(), W.kv_b_proj.bf(), scratch, k_nope.bf(), v.bf(), T, L, Nl, P, V,
                             head_split_copy_, by_block);
      break;
    }
    case Stage::Stage_attention_mha: {
      cuda::MhaArgs a;
      a.q_nope = in(rank, "q_nope").bf();
      a.q_pe_rope = in(rank, "q_pe_rope").bf();
      a.k_nope = in(rank, "k_nope").bf();
      a.k_pe_rope = in(rank, "k_pe_rope").bf();
      a.v = in(rank, "v").bf();
      a.cache = rs.cache.at(layer).bf();
      a.w_kvb = W.kv_b_proj.bf();
      a.T = static_cast<int>(T);
      a.Nl = static_cast<int>(Nl);
      a.P = static_cast<int>(P);
      a.R = static_cast<int>(R);
      a.V = static_cast<int>(V);
      a.L = static_cast<int>(L);
      a.scale = softmax_scale;
      a.causal = !planted("causal-off");
      a.lse_base2 = planted("lse-base2");
      a.window = planted("sliding-window") ? kSlidingWindowBug : 0;
      a.attn_out = out(rank, "attn_out", {T, Nl, V}).bf();
      a.lse = out(rank, "lse", {T, Nl}, DType::DType_f32).f32();
      a.kernel = mha_kernel_;
      if (cfg_.has_dsa()) {  // DSA: each token attends to its selected keys only
        cuda::SparseMhaArgs sparse;
        static_cast<cuda::MhaArgs&>(sparse) = a;
        sparse.topk = selected_keys(rank);
        sparse.k = cfg_.index_topk;
        cuda::launch_attention_mha_sparse(sparse, rc);
      } else {
        cuda::launch_attention_mha(a, rc);
      }
      break;
    }
    case Stage::Stage_q_absorb: {
      const DeviceTensor& q_nope = in(rank, "q_nope");
      DeviceTensor& q_lat = out(rank, "q_latent", {T, Nl, L});
      cuda::launch_q_absorb(hb, q_nope.bf(), W.kv_b_proj.bf(), q_lat.bf(), T, Nl, P, V, L,
                            /*wuk_transposed=*/planted("wuk-transpose"));
      break;
    }
    case Stage::Stage_attention_mqa: {
      cuda::MqaArgs a;
      a.q_latent = in(rank, "q_latent").bf();
      a.q_pe_rope = in(rank, "q_pe_rope").bf();
      a.cache = rs.cache.at(layer).bf();
      a.cache_rows = static_cast<int64_t>(rs.cache.at(layer).bytes() / (sizeof(bf16) * (L + R)));
      if (planted("decode-empty-cache") && rs.bug_snapshot_layer == layer)  // this step's rows not yet written
        a.cache = static_cast<const bf16*>(rc.scratch("bug.cache_before_write", rs.cache.at(layer).bytes()));
      if (rs.bug_block_table.get()) a.block_table = static_cast<const int*>(rs.bug_block_table.get());
      a.T = static_cast<int>(T);
      a.Nl = static_cast<int>(Nl);
      a.L = static_cast<int>(L);
      a.R = static_cast<int>(R);
      a.scale = softmax_scale;
      a.attn_latent = out(rank, "attn_latent", {T, Nl, L}).bf();
      a.lse = out(rank, "lse", {T, Nl}, DType::DType_f32).f32();
      a.kernel = mqa_kernel_;
      if (cfg_.has_dsa()) {  // DSA: each token attends to its selected cache rows only
        cuda::SparseMqaArgs sparse;
        static_cast<cuda::MqaArgs&>(sparse) = a;
        sparse.topk = selected_keys(rank);
        sparse.k = cfg_.index_topk;
        cuda::launch_attention_mqa_sparse(sparse, rc);
      } else {
        cuda::launch_attention_mqa(a, rc);
      }
      break;
    }
    case Stage::Stage_v_up: {
      const DeviceTensor& lat = in(rank, "attn_latent");
      DeviceTensor& o = out(rank, "attn_out", {T, Nl, V});
      // v-up-head: the model's last head (the last rank's last local head) reads its neighbour's W_UV.
      cuda::launch_v_up(hb, lat.bf(), W.kv_b_proj.bf(), o.bf(), T, Nl, P, V, L,
                        /*last_head_from_previous=*/planted("v-up-head") && rank == tp_ - 1);
      break;
    }
    case Stage::Stage_o_proj: {
      const DeviceTensor& a = in(rank, "attn_out");
      DeviceTensor& o = out(rank, "o_partial", {T, H});
      cuda::launch_o_proj(hb, a.bf(), W.o_proj.bf(), o.bf(), T, Nl * V, H,
                          /*reduce=*/planted("o-proj-half-heads") ? Nl * V / 2 : 0);  // a wrong K
      break;
    }
    case Stage::Stage_all_reduce: {
      // Rank 0's call allocates (and poisons) every rank's output: a communicator may write them all at once.
      // (One process per rank: each allocates its own.)
      if (rank == 0 || own_rank_ >= 0)
        for (int q = 0; q < tp_; ++q) {
          if (!owns_rank(q)) continue;
          DeviceGuard gq(ranks_[q].ctx->device());
          out(q, "o", {T, H});
        }
      cuda::ReduceBuffers b;
      b.count = T * H;
      if (planted("allreduce-skip")) b.summed = 1;  // o = rank 0's o_partial only
      for (int q = 0; q < tp_; ++q) {
        b.partial.push_back(owns_rank(q) ? in(q, "o_partial").bf() : nullptr);
        b.out.push_back(owns_rank(q) ? in(q, "o").bf() : nullptr);
      }
      std::vector<RankContext*> rcs;
      for (auto& r : ranks_) rcs.push_back(r.ctx.get());
      comm_->all_reduce(rank, rcs, b);
      break;
    }
    case Stage::Stage_residual: {
      const DeviceTensor& h = in(rank, "h");
      const DeviceTensor& o = in(rank, "o");
      DeviceTensor& h_out = out(rank, "h_out", {T, H});
      if (planted("residual-drop"))  // the add forgotten: h_out = o
        CUDA_CHECK(cudaMemcpyAsync(h_out.buf.get(), o.buf.get(), o.bytes(), cudaMemcpyDeviceToDevice, s));
      else
        cuda::launch_residual(h.bf(), o.bf(), h_out.bf(), T * H, s);
      break;
    }
  }
}

std::vector<unsigned char> CudaEngine::raw_bytes(int rank, const DeviceTensor& t) const {
  RankContext& rc = *ranks_[rank].ctx;
  DeviceGuard g(rc.device());
  std::vector<unsigned char> raw(t.bytes());
  if (!raw.empty()) CUDA_CHECK(cudaMemcpyAsync(raw.data(), t.buf.get(), raw.size(), cudaMemcpyDeviceToHost, rc.stream()));
  CUDA_CHECK(cudaStreamSynchronize(rc.stream()));
  return raw;
}

Tensor CudaEngine::to_float(const DeviceTensor& t, const std::vector<unsigned char>& raw) {
  Tensor out(t.shape);
  if (t.dtype == DType::DType_bf16) {
    for (int64_t i = 0; i < out.numel(); ++i) {
      uint16_t b;
      std::memcpy(&b, raw.data() + 2 * i, 2);
      out.data[i] = from_bf16_bits(b);
    }
  } else {
    std::memcpy(out.ptr(), raw.data(), raw.size());
  }
  return out;
}

Tensor CudaEngine::download(int rank, const std::string& name) {
  const DeviceTensor& t = in(rank, name);
  return to_float(t, raw_bytes(rank, t));
}

const Tensor* CudaEngine::weight(int layer, int rank, const std::string& name, Tensor& out) {
  if (!owns_rank(rank) || layer < 0) return nullptr;
  const RankState& rs = ranks_.at(rank);
  if (layer >= static_cast<int>(rs.weights.size())) return nullptr;
  const DeviceLayerWeights& w = rs.weights[layer];
  const DeviceTensor* t = name == "input_layernorm"      ? &w.input_norm
                          : name == "q_a_proj"           ? &w.q_a_proj
                          : name == "q_a_layernorm"      ? &w.q_a_norm
                          : name == "q_b_proj" || name == "q_proj" ? &w.q_b_proj
                          : name == "kv_a_proj_with_mqa" ? &w.kv_a_proj
                          : name == "kv_a_layernorm"     ? &w.kv_a_norm
                          : name == "kv_b_proj"          ? &w.kv_b_proj
                          : name == "o_proj"             ? &w.o_proj
                          : name == "indexer.wq_b"       ? &w.idx_wq_b
                          : name == "indexer.wk"         ? &w.idx_wk
                          : name == "indexer.k_norm"     ? &w.idx_k_norm
                          : name == "indexer.k_norm_bias" ? &w.idx_k_norm_bias
                          : name == "indexer.weights_proj" ? &w.idx_weights_proj
                                                         : nullptr;
  if (!t || t->bytes() == 0) return nullptr;
  // The bf16 values the kernels read: after this engine's own dequantization and shard cut.
  DeviceGuard g(rs.ctx->device());
  out = to_float(*t, raw_bytes(rank, *t));
  if (out.shape.size() == 1) out.shape = {1, out.shape[0]};  // a norm's weight: one row
  return &out;
}

void CudaEngine::upload(int rank, const std::string& name, const Tensor& t) {
  RankState& rs = ranks_.at(rank);
  RankContext& rc = *rs.ctx;
  DeviceGuard g(rc.device());
  auto it = rs.tensors.find(name);
  // fp32 tensors: the softmax lse, DSA's scores and its selected key numbers (exact as floats).
  const bool f32 = name == "lse" || name == "idx_scores" || name == "topk";
  const DType dt = it != rs.tensors.end() ? it->second.dtype : (f32 ? DType::DType_f32 : DType::DType_bf16);
  if (staged(rank, name)) launch_staged();  // the probe reads the old contents
  if (held(rank, name)) flush_probes();
  // Synchronous, and after everything queued on the stream: the old contents may still be read.
  CUDA_CHECK(cudaStreamSynchronize(rc.stream()));
  rs.tensors[name] = to_device(rc, t, dt);
}

ProbeRecord CudaEngine::probe(int rank, const ProbeSpec& spec, const ProbeRequest& req) {
  const DeviceTensor& t = in(rank, spec.name);
  if (!device_probes_) {
    const auto raw = raw_bytes(rank, t);
    return compute_probe_record(to_float(t, raw), cuda::dtype_name(t.dtype), req);
  }
  launch_staged();  // in start order
  cuda::ProbeCapture& cap = capture(rank);
  last_built_ = &cap;
  const int slot = cap.start(spec.name, t, req);
  cap.ship(slot);
  return cap.finish(slot);
}

void CudaEngine::probe_async(int rank, const ProbeSpec& spec, const ProbeRequest& req) {
  if (!device_probes_) return Engine::probe_async(rank, spec, req);
  in(rank, spec.name);  // a probe of a tensor the rank lacks fails here, not at the flush
  // Held when its tensor has few rows (decode, short prompts: there the launches, not the bytes, are the cost), and
  // after one is held (the records come back in start order).
  const int64_t rows = req.tokens > 0 ? req.tokens : 1;
  if (holds_probes() && (!held_.empty() || rows <= held_rows_max_)) {
    launch_staged();  // the records come back in start order
    held_.push_back({rank, spec.name, req});
    return;
  }
  if (probe_batch_ != ProbeBatch::kProbe && queues_probes()) {
    staged_.push_back({rank, spec.name, req});
    return;
  }
  start_probe(rank, spec.name, req);
}

void CudaEngine::start_probe(int rank, const std::string& name, const ProbeRequest& req) {
  cuda::ProbeCapture& cap = capture(rank);
  build(cap, cap.start(name, in(rank, name), req));
}

void CudaEngine::build(cuda::ProbeCapture& cap, int slot) {
  if (!builder_) builder_ = std::make_unique<ProbeRecordBuilder>();
  builder_->push({[&cap, slot] { cap.ship(slot); }, [&cap, slot] { return cap.finish(slot); }});
  last_built_ = &cap;
}

bool CudaEngine::listed(const std::vector<HeldProbe>& list, int rank, const std::string& name) {
  for (const auto& h : list)
    if (h.rank == rank && h.name == name) return true;
  return false;
}
bool CudaEngine::held(int rank, const std::string& name) const { return listed(held_, rank, name); }
bool CudaEngine::staged(int rank, const std::string& name) const { return listed(staged_, rank, name); }

void CudaEngine::start_all(const std::vector<HeldProbe>& list, bool beside) {
  // Each rank's probes in few launches, then the jobs in start order (the order the records are taken in).
  std::vector<std::vector<int>> slots(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    std::vector<cuda::ProbeCapture::Start> mine;
    for (const auto& h : list)
      if (h.rank == static_cast<int>(r)) mine.push_back({h.name, &in(h.rank, h.name), h.req});
    if (mine.empty()) continue;
    DeviceGuard g(ranks_[r].ctx->device());
    slots[r] = capture(static_cast<int>(r)).start_many(mine, beside);
  }
  std::vector<size_t> next(ranks_.size(), 0);
  for (const auto& h : list) build(capture(h.rank), slots[h.rank][next[h.rank]++]);
}

void CudaEngine::note_stage(const StageSpec& st, int layer) {
  if (layer != staged_layer_ || st.stage == Stage::Stage_layer_input) attention_begun_ = false;
  staged_layer_ = layer;
  if (st.stage == Stage::Stage_attention_mha || st.stage == Stage::Stage_attention_mqa) attention_begun_ = true;
}

void CudaEngine::launch_staged() {
  if (staged_.empty()) return;
  std::vector<HeldProbe> list;
  list.swap(staged_);  // a failed launch drops the rest: the device is gone
  start_all(list, true);
}

void CudaEngine::flush_probes() {
  launch_staged();  // started before the held ones
  if (held_.empty()) return;
  std::vector<HeldProbe> held;
  held.swap(held_);
  start_all(held, probe_copy_side_);  // the copy beside the next stages, or behind the kernels
}

bool CudaEngine::device_stage(int rank, int& layer, Stage& stage) const {
  if (rank < 0 || rank >= static_cast<int>(begun_.size())) return false;
  for (const auto& b : begun_[rank]) {
    const cudaError_t e = cudaEventQuery(b.done);
    if (e == cudaSuccess) continue;
    if (e != cudaErrorNotReady) return false;  // a device fault: collect_probes reports it
    layer = b.layer;
    stage = b.stage;
    return true;
  }
  return false;
}

void CudaEngine::collect_probes(std::vector<ProbeRecord>& out, bool wait) {
  Engine::collect_probes(out, wait);
  if (wait) flush_probes();
  else if (staged_launch_now()) launch_staged();
  if (builder_) builder_->take(out, wait);
}

cuda::ProbeCapture& CudaEngine::capture(int rank) {
  if (static_cast<int>(captures_.size()) <= rank) captures_.resize(rank + 1);
  if (!captures_[rank]) {
    cuda::ProbeCaptureOptions o;
    o.side_stream = probe_side_stream_;
    o.programmatic = probe_pdl_;
    o.flag_by_kernel = probe_flag_kernel_;
    captures_[rank] = std::make_unique<cuda::ProbeCapture>(*ranks_.at(rank).ctx, o);
  }
  return *captures_[rank];
}

}  // namespace

std::unique_ptr<Engine> make_cuda_engine(const std::map<std::string, std::string>& options) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    cudaGetLastError();
    throw UsageError(std::string("--engine cuda: no CUDA device is available (") +
                     (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") +
                     "); use --engine reference or --candidate reference:precision=bf16 on a CPU-only machine");
  }
  return std::make_unique<CudaEngine>(options);
}

}  // namespace mla
