// (Host code, no kernels.) Queued probe records: kernels/probe_capture.cuh.
#include "kernels/probe_capture.cuh"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "kernels/cuda_check.cuh"
#include "kernels/probe_launch_plan.cuh"
#include "kernels/probe_stats.cuh"

namespace mla::cuda {

namespace {
size_t align8(size_t n) { return (n + 7) & ~size_t{7}; }

// Pinned host memory, grown on demand (never shrunk: slots are reused from probe to probe).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (p_) cudaFreeHost(p_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  unsigned char* reserve(size_t bytes, unsigned flags = cudaHostAllocDefault) {
    if (bytes > bytes_) {
      const size_t want = std::max(bytes, bytes_ * 2);
      if (p_) CUDA_CHECK(cudaFreeHost(p_));
      p_ = nullptr;
      bytes_ = 0;
      CUDA_CHECK(cudaHostAlloc(&p_, want, flags | cudaHostAllocPortable));
      bytes_ = want;
    }
    return static_cast<unsigned char*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};
}  // namespace

// Where one probe's results are: the same layout on the device (scratch) and in pinned host memory.
struct ProbeCapture::Slot {
  // What finish() needs to fold the record.
  ProbeRecord rec;  // shape, dtype, level
  DType dtype = DType::DType_bf16;
  int64_t rows = 0, heads = 0, numel = 0;
  ProbeStatsPlan plan;  // the launch's units of stats and workspace (probe_stats_plan)
  bool sketch = false, full = false;
  size_t off_stats = 0, off_check = 0, off_tok = 0, off_head = 0, off_sketch = 0, off_raw = 0, bytes = 0;
  unsigned seq = 0;
  std::atomic<bool> busy{false};  // from start() until finish() has read everything
  unsigned char* dev = nullptr;   // the results on the device (the rank's scratch)
  const void* zeroed_at = nullptr;  // the stats kernel's counters last zeroed here (ProbeStatsPlan::counter_bytes)
  size_t zeroed_bytes = 0;
  PinnedBuffer host;
  PinnedBuffer flag_mem;  // mapped: one unsigned, written by the device when the copies are done
  volatile unsigned* flag = nullptr;
  unsigned* flag_dev = nullptr;
  Arena* arena = nullptr;  // start_many: the results are at arena_off in this arena (not in `host`)
  size_t arena_off = 0;
  cudaEvent_t computed = nullptr;  // on the rank's stream: the tensor is complete (side stream) or the results are
                                   // in the slot's device scratch (rank stream)
  int device = 0;

  ~Slot() {
    DeviceGuard g(device);
    if (computed) cudaEventDestroy(computed);
  }
};

// One start_many's results, contiguous on the device and in pinned host memory: one copy, one flag.
struct ProbeCapture::Arena {
  DeviceBuffer dev;
  PinnedBuffer host;
  PinnedBuffer flag_mem;  // mapped: written by the device when the copy is done
  volatile unsigned* flag = nullptr;
  unsigned* flag_dev = nullptr;
  unsigned seq = 0;
  size_t bytes = 0;
  std::atomic<int> pending{0};  // records not yet finished; 0: free
  // beside: the copy goes on the copy stream after `computed` (on the rank's stream, after the kernels), queued by
  // the first ship() of one of its slots (`shipped`).
  bool beside = false;
  std::atomic<bool> shipped{false};
  cudaEvent_t computed = nullptr;
  int device = 0;

  ~Arena() {
    DeviceGuard g(device);
    if (computed) cudaEventDestroy(computed);
  }
};

ProbeCapture::ProbeCapture(RankContext& rc, const ProbeCaptureOptions& options)
    : rc_(rc), side_stream_(options.side_stream), programmatic_(options.programmatic) {
  DeviceGuard g(rc_.device());
  if (!options.flag_by_kernel) write_flag_ = find_stream_write_value32();
  // The copy stream at the device's greatest priority: its few operations (a stream wait, a copy, the flag) go
  // first when the rank's stream has work queued, so the records reach the host while the layer runs. Not with
  // the side stream, where the probe kernels themselves run on it and would go before the rank's stages.
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_CHECK(cudaStreamCreateWithPriority(&copy_, cudaStreamNonBlocking, side_stream_ ? least : greatest));
}

ProbeCapture::~ProbeCapture() {
  DeviceGuard g(rc_.device());
  if (copy_) {
    cudaStreamSynchronize(copy_);
    cudaStreamDestroy(copy_);
  }
}

const uint32_t* ProbeCapture::sign_bits(uint64_t key, int64_t col0, int64_t cols) {
  auto k = std::make_tuple(key, col0, cols);
  auto it = signs_.find(k);
  if (it != signs_.end()) return static_cast<const uint32_t*>(it->second.get());
  DeviceBuffer b(rc_.device(), sketch_sign_bits_words(cols) * sizeof(uint32_t));
  launch_sketch_sign_bits(key, col0, cols, static_cast<uint32_t*>(b.get()), rc_.stream());
  return static_cast<const uint32_t*>(signs_.emplace(k, std::move(b)).first->second.get());
}

ProbeCapture::Slot& ProbeCapture::slot(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return *slots_.at(id);
}

double ProbeCapture::build_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return built_s_;
}

double ProbeCapture::last_build_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_built_s_;
}

int ProbeCapture::start(const std::string& probe, const DeviceTensor& t, const ProbeRequest& req) {
  DeviceGuard g(rc_.device());
  ProbeStatsArgs a;
  cudaStream_t stream = nullptr;
  const int id = layout(probe, t, req, a);
  place(id, req, a, nullptr, stream);
  Slot& s = slot(id);
  if (s.numel > 0) {
    launch_probe_stats(rc_.probe_launch_cache(), a, programmatic_, stream);
    copy_full(s, t, stream);
    if (!side_stream_) CUDA_CHECK(cudaEventRecord(s.computed, stream));
  }
  return id;
}

std::vector<int> ProbeCapture::start_many(const std::vector<Start>& list, bool beside) {
  DeviceGuard g(rc_.device());
  std::vector<int> ids;
  // Every record's results in one arena, so that one copy and one flag bring them all to the host. The tensors the
  // tile kernel's task kind takes go in batch launches; the rest (wide tensors folded in their blocks, fp32 and odd
  // widths) one launch each, as start() makes them.
  std::vector<ProbeStatsArgs> args(list.size());
  std::vector<size_t> offsets(list.size());
  size_t total = 0;
  for (size_t k = 0; k < list.size(); ++k) {
    ids.push_back(layout(list[k].probe, *list[k].tensor, list[k].req, args[k]));
    offsets[k] = total;
    total = align8(total + slot(ids[k]).bytes);
  }
  Arena& arena = free_arena(std::max<size_t>(total, 8));
  arena.pending.store(static_cast<int>(list.size()), std::memory_order_relaxed);
  *arena.flag = 0;
  arena.seq = arena.seq + 1 ? arena.seq + 1 : 1;
  arena.bytes = total;
  std::vector<ProbeStatsArgs> batch, others;
  cudaStream_t stream = rc_.stream();
  for (size_t k = 0; k < list.size(); ++k) {
    Slot& s = slot(ids[k]);
    s.arena = &arena;
    s.arena_off = offsets[k];
    place(ids[k], list[k].req, args[k], static_cast<unsigned char*>(arena.dev.get()) + offsets[k], stream);
    if (s.numel == 0) continue;
    if (probe_stats_batchable(rc_.probe_launch_cache(), args[k])) batch.push_back(args[k]);
    else others.push_back(args[k]);
  }
  if (side_stream_) {  // the kernels, the copy and the flag on the side stream, after the tensors
    CUDA_CHECK(cudaEventRecord(arena.computed, stream));
    CUDA_CHECK(cudaStreamWaitEvent(copy_, arena.computed, 0));
    stream = copy_;
    beside = false;
  }
  // With the copy beside, the first kernel is launched as a programmatic dependent of the kernel before it (a stage,
  // or a layer's last stage for held probes; start()); with the copy behind the kernels plainly (measured not to
  // help there).
  const bool programmatic = beside && programmatic_;
  for (const auto& a : others) launch_probe_stats(rc_.probe_launch_cache(), a, programmatic, stream);
  launch_probe_stats_batch(rc_.probe_launch_cache(), batch, programmatic, stream);
  for (size_t k = 0; k < list.size(); ++k)
    if (slot(ids[k]).numel > 0) copy_full(slot(ids[k]), *list[k].tensor, stream);
  arena.beside = beside;
  if (beside) {  // the copy overlaps the rank's next stages (ship)
    arena.shipped.store(false, std::memory_order_relaxed);
    CUDA_CHECK(cudaEventRecord(arena.computed, stream));
    return ids;
  }
  // The arena's copy and flag behind the kernels on the rank's stream itself (the engine's probe_copy=rank): the next
  // stages wait for the copy, which a device fault in them then cannot stop.
  CUDA_CHECK(cudaMemcpyAsync(arena.host.reserve(0), arena.dev.get(), arena.bytes, cudaMemcpyDeviceToHost, stream));
  launch_set_flag(arena.flag_dev, arena.seq, write_flag_, stream);
  return ids;
}

// An arena no record reads any more (its slots all finished): the smallest that holds `bytes`, else the largest,
// grown to `bytes` (a stage's arena and a layer's differ in size, and growing device memory synchronizes the
// device); a new one when none is free.
ProbeCapture::Arena& ProbeCapture::free_arena(size_t bytes) {
  Arena* a = nullptr;
  for (auto& x : arenas_) {
    if (x->pending.load(std::memory_order_acquire) != 0) continue;
    const size_t have = x->dev.bytes(), best = a ? a->dev.bytes() : 0;
    const bool best_fits = a && best >= bytes;
    if (!a || (best_fits ? have >= bytes && have < best : have > best)) a = x.get();
  }
  if (!a) {
    auto n = std::make_unique<Arena>();
    n->device = rc_.device();
    CUDA_CHECK(cudaEventCreateWithFlags(&n->computed, cudaEventDisableTiming));
    n->flag = reinterpret_cast<volatile unsigned*>(n->flag_mem.reserve(sizeof(unsigned), cudaHostAllocMapped));
    CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&n->flag_dev), const_cast<unsigned*>(n->flag), 0));
    arenas_.push_back(std::move(n));
    a = arenas_.back().get();
  }
  if (a->dev.bytes() < bytes) a->dev = DeviceBuffer(rc_.device(), std::max(bytes, a->dev.bytes() * 2));
  a->host.reserve(bytes);
  return *a;
}

// At full level, after the slot's kernels: the device copy of the tensor beside its results.
void ProbeCapture::copy_full(Slot& s, const DeviceTensor& t, cudaStream_t stream) {
  if (s.full) CUDA_CHECK(cudaMemcpyAsync(s.dev + s.off_raw, t.buf.get(), t.bytes(), cudaMemcpyDeviceToDevice, stream));
}

int ProbeCapture::layout(const std::string& probe, const DeviceTensor& t, const ProbeRequest& req,
                         ProbeStatsArgs& a) {
  auto& mine = by_probe_[probe];
  int id = -1;
  for (int k : mine)
    if (!slot(k).busy.load(std::memory_order_acquire)) id = k;
  if (id < 0) {
    auto s = std::make_unique<Slot>();
    s->device = rc_.device();
    CUDA_CHECK(cudaEventCreateWithFlags(&s->computed, cudaEventDisableTiming));
    s->flag = reinterpret_cast<volatile unsigned*>(s->flag_mem.reserve(sizeof(unsigned), cudaHostAllocMapped));
    CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&s->flag_dev), const_cast<unsigned*>(s->flag), 0));
    std::lock_guard<std::mutex> lock(mu_);
    id = static_cast<int>(slots_.size());
    mine.push_back(id);
    slots_.push_back(std::move(s));
  }
  Slot& s = slot(id);
  s.busy.store(true, std::memory_order_relaxed);
  s.rec = ProbeRecord{};
  s.rec.shape = t.shape;
  s.rec.dtype = dtype_name(t.dtype);
  s.rec.level = req.level;
  s.dtype = t.dtype;
  s.numel = t.numel();
  s.rows = req.tokens > 0 ? req.tokens : 1;
  s.heads = req.heads > 0 ? req.heads : 0;
  s.sketch = req.level != ProbeLevel::ProbeLevel_stats;
  s.full = req.level == ProbeLevel::ProbeLevel_full;
  const int64_t cols = s.numel / s.rows;
  a = ProbeStatsArgs{};
  a.data = t.buf.get();
  a.dtype = t.dtype;
  a.rows = s.rows;
  a.cols = cols;
  a.heads = static_cast<int>(s.heads);
  s.plan = s.numel > 0 ? probe_stats_plan(rc_.probe_launch_cache(), a) : ProbeStatsPlan{};
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off = align8(off + bytes);
    return at;
  };
  s.off_stats = take(s.plan.units * kRowStats * sizeof(double));
  s.off_check = take(s.plan.units * sizeof(unsigned long long));
  s.off_tok = take(s.rows * sizeof(float));
  s.off_head = take(s.rows * s.heads * sizeof(float));
  s.off_sketch = take(s.sketch ? s.rows * kSketchDim * sizeof(float) : 0);
  s.off_raw = take(s.full ? t.bytes() : 0);  // full level: the tensor itself, copied on the device first
  s.bytes = off;  // what comes to the host; the stats kernels' workspace follows on the device only
  *s.flag = 0;
  s.seq = s.seq + 1 ? s.seq + 1 : 1;
  s.arena = nullptr;
  return id;
}

void ProbeCapture::place(int id, const ProbeRequest& req, ProbeStatsArgs& a, unsigned char* results,
                         cudaStream_t& stream) {
  Slot& s = slot(id);
  if (!results) s.host.reserve(std::max<size_t>(s.bytes, 8));
  stream = rc_.stream();
  if (s.numel > 0) {
    a.sketch_bits = s.sketch ? sign_bits(req.probe_key, req.col_offset, a.cols) : nullptr;
    const size_t work = s.plan.workspace;
    const size_t here = results ? 0 : s.bytes;  // the results in the slot's scratch, or at `results`
    auto* scratch = here + work > 0
                        ? static_cast<unsigned char*>(rc_.scratch("probe.slot" + std::to_string(id), here + work))
                        : nullptr;
    auto* dev = results ? results : scratch;
    s.dev = dev;
    a.row_stats = reinterpret_cast<double*>(dev + s.off_stats);
    a.row_checksum = reinterpret_cast<unsigned long long*>(dev + s.off_check);
    a.token_l2 = reinterpret_cast<float*>(dev + s.off_tok);
    a.head_l2 = s.heads ? reinterpret_cast<float*>(dev + s.off_head) : nullptr;
    a.sketch_out = s.sketch ? reinterpret_cast<float*>(dev + s.off_sketch) : nullptr;
    a.workspace = work ? scratch + here : nullptr;
    if (side_stream_ && !results) {  // the probe's kernels wait for the tensor, then run beside the rank's next stages
      CUDA_CHECK(cudaEventRecord(s.computed, stream));
      CUDA_CHECK(cudaStreamWaitEvent(copy_, s.computed, 0));
      stream = copy_;
    }
    const size_t counters = s.plan.counter_bytes;
    if (counters > 0 && (s.zeroed_at != a.workspace || s.zeroed_bytes < counters)) {  // new memory or layout
      CUDA_CHECK(cudaMemsetAsync(a.workspace, 0, counters, stream));
      s.zeroed_at = a.workspace;
      s.zeroed_bytes = counters;
    }
  }
}

void ProbeCapture::ship(int id) {
  Slot& s = slot(id);
  DeviceGuard g(rc_.device());
  if (s.arena) {  // start_many queued the arena's copy and flag, or left them to the first of its slots shipped
    Arena& a = *s.arena;
    if (a.beside && !a.shipped.exchange(true, std::memory_order_acq_rel)) {
      CUDA_CHECK(cudaStreamWaitEvent(copy_, a.computed, 0));
      CUDA_CHECK(cudaMemcpyAsync(a.host.reserve(0), a.dev.get(), a.bytes, cudaMemcpyDeviceToHost, copy_));
      launch_set_flag(a.flag_dev, a.seq, write_flag_, copy_);
    }
    return;
  }
  if (s.numel > 0) {
    if (!side_stream_) CUDA_CHECK(cudaStreamWaitEvent(copy_, s.computed, 0));  // (side: the kernels are on copy_)
    CUDA_CHECK(cudaMemcpyAsync(s.host.reserve(0), s.dev, s.bytes, cudaMemcpyDeviceToHost, copy_));
  }
  launch_set_flag(s.flag_dev, s.seq, write_flag_, copy_);
}

// The copies are done when the flag holds the slot's number (it is written after them, in stream order). Waiting
// reads mapped memory and makes no driver call, so the launching thread's calls never queue behind this wait; now
// and then the copy stream is asked whether the device failed (a sticky error), which ends the wait.
void ProbeCapture::wait_for_flag(const volatile unsigned* flag, unsigned seq) const {
  using Clock = std::chrono::steady_clock;
  auto check = Clock::now() + std::chrono::milliseconds(1);
  for (unsigned spins = 0; *flag != seq; ++spins) {
    if ((spins & 255u) != 255u) continue;
    std::this_thread::yield();
    if (Clock::now() < check) continue;
    const cudaError_t err = cudaStreamQuery(copy_);
    if (err != cudaSuccess && err != cudaErrorNotReady && *flag != seq)
      CUDA_CHECK(err);  // the device failed before this probe's copies were done
    check = Clock::now() + std::chrono::milliseconds(1);
  }
  std::atomic_thread_fence(std::memory_order_acquire);  // the results are read after the flag
}

ProbeRecord ProbeCapture::finish(int id) {
  Slot& s = slot(id);
  DeviceGuard g(rc_.device());
  struct Release {  // the slot (and its share of the arena) is free once everything is read, however finish() ends
    std::atomic<bool>& busy;
    std::atomic<int>* pending;
    ~Release() {
      busy.store(false, std::memory_order_release);
      if (pending) pending->fetch_sub(1, std::memory_order_acq_rel);
    }
  } release{s.busy, s.arena ? &s.arena->pending : nullptr};
  const volatile unsigned* flag = s.arena ? s.arena->flag : s.flag;
  const unsigned seq = s.arena ? s.arena->seq : s.seq;
  // Waiting anyway: the record's maps are allocated now, zero-filled, so that their copies below write into memory
  // the host has just touched. A layer's last record is built after the device is done, so its build is part of
  // the wall: on the H200 machine, for a [4096, 7168] probe at sketch level (a 512 KB sketch), 0.075-0.084 ms into
  // fresh memory, 0.036-0.040 ms this way. Not when the results are already in (the host is behind: filling twice
  // would cost more than it saves).
  const int64_t rows = s.rows;
  std::vector<float> token_l2, head_l2, sketch;
  const bool early = s.numel > 0 && *flag != seq;
  if (early) {
    token_l2.resize(rows);
    head_l2.resize(rows * s.heads);
    if (s.sketch) sketch.resize(rows * kSketchDim);
  }
  wait_for_flag(flag, seq);
  struct BuildClock {  // adds the time from here to the return to the build counters
    ProbeCapture& cap;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    ~BuildClock() {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::lock_guard<std::mutex> lock(cap.mu_);
      cap.last_built_s_ = s;
      cap.built_s_ += s;
    }
  } clock{*this};
  ProbeRecord rec = std::move(s.rec);
  if (s.numel == 0) {
    rec.token_l2.assign(rows, 0.f);
    if (s.heads) rec.head_l2.assign(rows * s.heads, 0.f);
    if (s.sketch) rec.sketch.assign(rows * kSketchDim, 0.f);
    return rec;
  }
  const unsigned char* host = s.arena ? s.arena->host.reserve(0) + s.arena_off : s.host.reserve(0);
  // The maps from the pinned buffer: into the vectors allocated while waiting, else straight, one pass each
  // (zero-filling them first and copying over doubled the host's work when it was behind: 2.5 MB per [4096,
  // 128-head] probe).
  const auto floats = [&](std::vector<float>& early_map, size_t off, int64_t n) {
    const auto* f = reinterpret_cast<const float*>(host + off);
    if (!early) return std::vector<float>(f, f + n);
    std::memcpy(early_map.data(), f, static_cast<size_t>(n) * sizeof(float));
    return std::move(early_map);
  };
  const auto* st = reinterpret_cast<const double*>(host + s.off_stats);
  const auto* check = reinterpret_cast<const unsigned long long*>(host + s.off_check);
  double sum = 0, sumsq = 0, amax = 0, nan = 0, inf = 0;
  uint64_t checksum = 0;
  for (int64_t u = 0; u < s.plan.units; ++u) {
    const double* p = st + u * kRowStats;
    sum += p[0];
    sumsq += p[1];
    amax = std::max(amax, p[2]);
    nan += p[3];
    inf += p[4];
    checksum += check[u];
  }
  rec.token_l2 = floats(token_l2, s.off_tok, rows);
  if (s.heads) rec.head_l2 = floats(head_l2, s.off_head, rows * s.heads);
  if (s.sketch) rec.sketch = floats(sketch, s.off_sketch, rows * kSketchDim);
  rec.checksum = checksum;
  rec.nan = static_cast<int64_t>(nan);
  rec.inf = static_cast<int64_t>(inf);
  const int64_t finite = s.numel - rec.nan - rec.inf;
  rec.l2 = std::sqrt(sumsq);
  rec.absmax = amax;
  rec.mean = finite ? sum / finite : 0.0;
  rec.std = finite ? std::sqrt(std::max(0.0, sumsq / finite - rec.mean * rec.mean)) : 0.0;
  if (s.full) {
    Tensor out(rec.shape);
    const unsigned char* raw = host + s.off_raw;
    if (s.dtype == DType::DType_bf16) {
      for (int64_t i = 0; i < s.numel; ++i) {
        uint16_t b;
        std::memcpy(&b, raw + 2 * i, 2);
        out.data[i] = from_bf16_bits(b);
      }
    } else {
      std::memcpy(out.ptr(), raw, s.numel * sizeof(float));
    }
    rec.data = std::move(out);
  }
  return rec;
}

}  // namespace mla::cuda
