// (Host code, no kernels.) Which probe kernel takes a tensor and with what geometry: the tile kernel
// (probe_tiles.cu) for bf16 tensors it covers, its 16-row tiles folded by their block when there are enough of them
// to fill the GPU, else by the tile's last warp or a fold kernel; the row kernel (probe_rows.cu) for the rest.
#include "kernels/probe_launch_plan.cuh"

#include <algorithm>
#include <climits>
#include <string>

#include "kernels/cuda_check.cuh"

namespace mla::cuda {

namespace {
int current_device() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

size_t align_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

TileGeometry compute_tile_geometry(ProbeLaunchCache& cache, const ProbeStatsArgs& a) {
  TileGeometry g;
  if (a.dtype != DType::DType_bf16 || a.cols <= 0 || a.cols % 8 != 0 ||
      (reinterpret_cast<uintptr_t>(a.data) & 15u) != 0)
    return g;
  int64_t unit = kMinSegCols;  // a segment is whole heads, or whole multiples of this
  if (a.heads > 0) {
    const int64_t X = a.cols / a.heads;
    if (X % 32 != 0 || X > kMaxHeadCols) return g;
    g.head_cols = unit = X;
  }
  g.row_tiles = (a.rows + kTileRows - 1) / kTileRows;
  const auto segs_of = [&](int64_t width) { return (a.cols + width - 1) / width; };
  const int64_t widest = unit * std::max<int64_t>(1, kSegCols / unit);
  // Enough tiles for a block each on every SM: the block folds its tile. The narrowest segments (the most warps)
  // whose blocks still fit in one wave; when none do, the widest (fewest warps per block, several waves).
  if (g.row_tiles >= cache.tile_occupancy(true, 1).sms && segs_of(widest) <= kMaxBlockWarps) {
    g.block_fold = true;
    g.seg_width = widest;
    const int64_t step = a.heads > 0 ? unit : kBlockMinSegCols;
    for (int64_t width = step; width < widest; width += step) {
      const int64_t segs = segs_of(width);
      // The narrowest width of each count only.
      if (segs > kMaxBlockWarps || (width > step && segs_of(width - step) == segs)) continue;
      const TileOccupancy o = cache.tile_occupancy(true, static_cast<int>(segs));
      if (int64_t{o.blocks} * o.sms >= g.row_tiles) {
        g.seg_width = width;
        break;
      }
    }
    g.segs = segs_of(g.seg_width);
    return g;
  }
  // Else blocks of kTileWarps warps, a warp per (tile, segment): segments as narrow as one wave of warps allows
  // (down to one unit): more warps while they fit at once, but not a second wave, whose warps would wait for the
  // first's (each segment also adds a partial per row to fold).
  const TileOccupancy o = cache.tile_occupancy(false, kTileWarps);
  const int64_t wave = std::max<int64_t>(1, int64_t{o.sms} * o.blocks * kTileWarps);
  g.seg_width = widest;
  while (g.seg_width > unit) {
    const int64_t narrower = std::max<int64_t>(unit, g.seg_width / 2 / unit * unit);
    if (g.row_tiles * segs_of(narrower) > wave) break;
    g.seg_width = narrower;
  }
  g.segs = segs_of(g.seg_width);
  g.fold_inline = g.segs <= kInlineFoldSegs;
  return g;
}

// The tiles' counters at the workspace's start (the last-warp fold only).
size_t counter_bytes(const TileGeometry& g) {
  return g.segs > 1 && g.fold_inline ? align_up(static_cast<size_t>(g.row_tiles) * sizeof(unsigned), 16) : 0;
}

// Which kernels a launch takes: the tiles folded in their blocks, the tiles' tasks (folded by a tile's last warp,
// or the fold kernel when it has many segments; the workspace holds their partials), or a warp per row (fp32,
// odd widths).
enum class LaunchPath { kBlockFold, kTasks, kRows };
LaunchPath launch_path(const TileGeometry& g) {
  if (g.block_fold && g.row_tiles <= INT_MAX) return LaunchPath::kBlockFold;
  const int64_t tasks = g.row_tiles * g.segs;
  if (g.segs > 0 && !g.block_fold && (tasks + kTileWarps - 1) / kTileWarps <= INT_MAX) return LaunchPath::kTasks;
  return LaunchPath::kRows;
}
}  // namespace

// A probe asks for its geometry three times (workspace, counters, launch), and the narrowest width's search asks
// for up to ten occupancies, each a device query; every layer probes the same shapes again.
TileGeometry ProbeLaunchCache::tile_geometry(const ProbeStatsArgs& a) {
  const bool aligned = (reinterpret_cast<uintptr_t>(a.data) & 15u) == 0;
  const auto key = std::make_tuple(current_device(), static_cast<int>(a.dtype), a.rows, a.cols, a.heads, aligned);
  if (const auto it = geometry_.find(key); it != geometry_.end()) return it->second;
  const TileGeometry g = compute_tile_geometry(*this, a);
  return geometry_.emplace(key, g).first->second;
}

TileOccupancy ProbeLaunchCache::tile_occupancy(bool block_fold, int warps) {
  const auto key = std::make_tuple(current_device(), block_fold, warps);
  if (const auto it = occupancy_.find(key); it != occupancy_.end()) return it->second;
  const TileOccupancy o = probe_tiles_occupancy(block_fold, warps);
  return occupancy_.emplace(key, o).first->second;
}

bool ProbeLaunchCache::supports_programmatic_launches() {
  const int dev = current_device();
  if (const auto it = sm90_.find(dev); it != sm90_.end()) return it->second;
  int major = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return sm90_.emplace(dev, major >= 9).first->second;
}

ProbeStatsPlan probe_stats_plan(ProbeLaunchCache& cache, const ProbeStatsArgs& a) {
  const TileGeometry g = cache.tile_geometry(a);
  const LaunchPath path = launch_path(g);
  ProbeStatsPlan p;
  p.units = path == LaunchPath::kBlockFold || (path == LaunchPath::kTasks && g.fold_inline) ? g.row_tiles : a.rows;
  if (path == LaunchPath::kTasks) {
    const size_t n = static_cast<size_t>(a.rows * g.segs);
    p.counter_bytes = counter_bytes(g);
    p.workspace = p.counter_bytes + n * sizeof(RowPartial) + n * kSketchLanes * sizeof(float);
  }
  return p;
}

size_t probe_stats_workspace(ProbeLaunchCache& cache, const ProbeStatsArgs& a) {
  return probe_stats_plan(cache, a).workspace;
}

void launch_probe_stats(ProbeLaunchCache& cache, const ProbeStatsArgs& a, bool programmatic, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (a.rows > INT_MAX) throw EngineError("probe stats: " + std::to_string(a.rows) + " rows");
  const TileGeometry g = cache.tile_geometry(a);
  const LaunchPath path = launch_path(g);
  if (path == LaunchPath::kTasks && !a.workspace)
    throw EngineError("probe stats: no workspace for a [" + std::to_string(a.rows) + ", " + std::to_string(a.cols) +
                      "] tensor's partials (probe_stats_plan(a).workspace bytes)");
  // Programmatic dependent launches (compute capability 9 on): the launch of a probe's kernel overlaps the end of
  // the stream's previous kernel, the stage that wrote the tensor, and the kernel waits for it before any memory
  // access (griddepcontrol.wait).
  const auto pdl = [&] { return programmatic && cache.supports_programmatic_launches(); };
  if (path == LaunchPath::kBlockFold) {
    const int warps = static_cast<int>(g.segs);
    launch_probe_tiles(true, static_cast<unsigned>(g.row_tiles), warps, a, g, nullptr, nullptr, nullptr, pdl(),
                       stream);
    return;
  }
  if (path == LaunchPath::kTasks) {
    const TileBatchTask t = task_launch(a, g);
    launch_probe_tiles(false, static_cast<unsigned>(task_blocks(g)), kTileWarps, a, g, t.part, t.sketch_part,
                       t.tile_done, pdl(), stream);
    if (!g.fold_inline) launch_probe_fold_rows(a, g, t.part, t.sketch_part, stream);
    return;
  }
  launch_probe_rows(a, cache.tile_occupancy(false, kTileWarps).sms, stream);
}

TileBatchTask task_launch(const ProbeStatsArgs& a, const TileGeometry& g) {
  TileBatchTask t;
  t.a = a;
  t.g = g;
  t.tile_done = static_cast<unsigned*>(a.workspace);
  t.part = reinterpret_cast<RowPartial*>(static_cast<unsigned char*>(a.workspace) + counter_bytes(g));
  t.sketch_part = reinterpret_cast<float*>(t.part + a.rows * g.segs);
  t.first_block = 0;
  return t;
}

int64_t task_blocks(const TileGeometry& g) { return (g.row_tiles * g.segs + kTileWarps - 1) / kTileWarps; }

int probe_rows_parts(const ProbeStatsArgs& a, int sms) {
  int parts = 1;  // decode's 64 rows: 8; 128 rows: 4; T 512: 1
  if (a.sketch_bits)
    while (parts < kRowMaxSketchParts && a.rows * parts * 2 <= kRowSplitWarpsPerSm * sms) parts *= 2;
  return parts;
}

namespace {
// The warps a row of a batch's row task: without the sketch one; with it at least kBatchRowParts (a batch block's
// registers are fewer than the row kernel's, and a row's 32 sketch sums in double would not fit one warp's).
constexpr int kBatchRowParts = 4;
int batch_row_parts(ProbeLaunchCache& cache, const ProbeStatsArgs& a) {
  if (!a.sketch_bits) return 1;
  return std::max(kBatchRowParts, probe_rows_parts(a, cache.tile_occupancy(false, kTileWarps).sms));
}
// A row-kernel tensor goes in a batch, its rows beside the tiles, unless the batch would split its rows over more
// warps than the row kernel does where that costs: always at stats level (a warp a row either way); with the sketch
// for small tensors (lse), whose extra warps cost nothing, and for few rows, which the row kernel splits over 4 or 8
// warps already.
bool batch_takes_rows(ProbeLaunchCache& cache, const ProbeStatsArgs& a) {
  if (launch_path(cache.tile_geometry(a)) != LaunchPath::kRows || a.rows > INT_MAX) return false;
  return !a.sketch_bits || a.rows * a.cols <= (int64_t{1} << 16) ||
         probe_rows_parts(a, cache.tile_occupancy(false, kTileWarps).sms) >= kBatchRowParts;
}
}  // namespace

bool probe_stats_batchable(ProbeLaunchCache& cache, const ProbeStatsArgs& a) {
  if (a.rows <= 0) return false;
  return (a.workspace && launch_path(cache.tile_geometry(a)) == LaunchPath::kTasks) || batch_takes_rows(cache, a);
}

void launch_probe_stats_batch(ProbeLaunchCache& cache, const std::vector<ProbeStatsArgs>& list, bool programmatic,
                              cudaStream_t stream) {
  if (list.size() == 1) return launch_probe_stats(cache, list[0], programmatic, stream);  // the same kernels
  programmatic = programmatic && cache.supports_programmatic_launches();
  for (size_t from = 0; from < list.size(); from += kTileBatchMax) {
    const size_t to = std::min(list.size(), from + kTileBatchMax);
    TileBatch tiles, folds;
    int64_t tile_blocks = 0, fold_blocks = 0;
    // The row tasks' blocks first: a row's warps run longest (a chain along the row), the tiles fill in after.
    for (size_t k = from; k < to; ++k) {
      const ProbeStatsArgs& a = list[k];
      if (!probe_stats_batchable(cache, a))
        throw EngineError("probe stats: a [" + std::to_string(a.rows) + ", " + std::to_string(a.cols) +
                          "] tensor is not one the batch launch takes (probe_stats_batchable)");
      if (!batch_takes_rows(cache, a)) continue;
      TileBatchTask t{};
      t.a = a;
      t.row_parts = batch_row_parts(cache, a);
      t.first_block = static_cast<unsigned>(tile_blocks);
      tiles.task[tiles.n++] = t;
      tile_blocks += (a.rows * t.row_parts + kTileWarps - 1) / kTileWarps;
    }
    for (size_t k = from; k < to; ++k) {
      const ProbeStatsArgs& a = list[k];
      if (batch_takes_rows(cache, a)) continue;
      const TileGeometry g = cache.tile_geometry(a);
      TileBatchTask t = task_launch(a, g);
      t.first_block = static_cast<unsigned>(tile_blocks);
      tiles.task[tiles.n++] = t;
      tile_blocks += task_blocks(g);
      if (!g.fold_inline) {
        t.first_block = static_cast<unsigned>(fold_blocks);
        folds.task[folds.n++] = t;
        fold_blocks += fold_row_blocks(a.rows);
      }
    }
    if (tile_blocks > INT_MAX || fold_blocks > INT_MAX) throw EngineError("probe stats: batch launch too large");
    launch_probe_tiles_batch(tiles, static_cast<unsigned>(tile_blocks), programmatic && from == 0, stream);
    launch_probe_fold_rows_batch(folds, static_cast<unsigned>(fold_blocks), stream);
  }
}

}  // namespace mla::cuda
