// The probe kernels as the host launches them (plain C++: probe_launch_plan.cpp includes it): the tile kernel's
// geometry and constants, and one launcher per kernel. The tile kernel (probe_tiles.cu) takes every bf16 tensor whose
// width is a multiple of 8 and whose heads (if any) are whole multiples of 32 columns; the row kernel (probe_rows.cu)
// takes the rest (fp32 tensors such as lse, odd widths, narrow heads). probe_launch_plan.cpp picks between them.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/probe_stats.cuh"
#include "core/probe/probe_hash.h"

namespace mla::cuda {

// A row's stats over one segment of its columns (the tile kernel's partial), folded by the tile's fold.
struct RowPartial {
  double sum, sumsq;
  float amax;
  unsigned nan, inf, unused;
  unsigned long long check;
};

constexpr int kTileRows = 16;
constexpr int kSegCols = 4096;  // per warp task at most, whole heads
constexpr int kMaxHeadCols = 1024;
constexpr int kTileWarps = 4;       // warps per block when the tile's last warp folds it (global partials)
constexpr int kMaxBlockWarps = 16;  // warps per block when the block folds its tile (one segment each)
// The ring's depth: kStages - 1 steps in flight per warp while one is computed.
constexpr int kStages = 3;
// Blocks per SM the tile kernel's registers are limited for: one-tile blocks that fold their tile, and the
// 4-warp blocks of (tile, segment) tasks (fewer rows: T < 16 rows per SM; 4 keeps them at 128 registers, 16 warps
// per SM).
constexpr int kTileMinBlocks = 1;
constexpr int kTaskMinBlocks = 4;
// The narrowest segment without heads, in columns (a multiple of 64): fewer, longer warps for narrow tensors
// ([4096, 512]: 18 µs with 256, 27 µs with 64, whose one-step warps and 8-segment fold cost more than they gained).
constexpr int64_t kMinSegCols = 256;
// The same when the block folds its tile (no global partials to fold: [4096, 512] 12.1 µs with 128, 13.8 with 256).
constexpr int64_t kBlockMinSegCols = 128;
constexpr int64_t kInlineFoldSegs = 16;  // up to this many segments per row the tile's last warp folds them
static_assert(kSegCols < 65536, "LaneRow::nan_inf counts a segment's NaN and Inf of a row in 16 bits each");

// One warp's slot of the tile kernel's ring: a step's four 16-byte chunks per lane (planes [half][row g, row g + 8],
// lane (g, t)'s chunk at index ring_index(g, t) of probe_tiles.cu) and the sign words of its two halves (at the
// lane's index).
struct TileStage {
  uint4 data[4][32];
  uint32_t signs[2][32];
};

// Dynamic shared memory of a tile kernel block of `warps` warps: their rings. A block that folds its tile reuses the
// ring for the partials (16 rows x (a RowPartial and 32 sketch floats) per warp, less than its ring).
constexpr size_t tile_smem(int warps) { return sizeof(TileStage) * warps * kStages; }
static_assert(kTileRows * (sizeof(RowPartial) + kSketchLanes * sizeof(float)) <= sizeof(TileStage) * kStages,
              "a block's fold reuses its rings");

struct TileGeometry {
  int64_t seg_width = 0;  // columns per segment (a multiple of 8; whole heads)
  int64_t segs = 0;       // segments per row
  int64_t head_cols = 0;  // X (0: no heads axis)
  int64_t row_tiles = 0;
  // How a tile's segments are folded: by the block (one block per tile, a warp per segment, the partials in shared
  // memory: enough tiles to fill the GPU); else by the tile's last warp to finish (partials in global memory, up to
  // kInlineFoldSegs segments), else by the fold kernel after the launch (launch_probe_fold_rows).
  bool block_fold = false;
  bool fold_inline = false;
};

// The current device's SM count and how many blocks of the tile kernel (the block-fold kind or the task kind) of
// `warps` warps are resident per SM at once. Also opts the kernel into the shared memory of its largest block.
struct TileOccupancy {
  int sms = 0, blocks = 0;
};
TileOccupancy probe_tiles_occupancy(bool block_fold, int warps);

// The tile kernel: with block_fold, `blocks` = the row tiles, a block of `warps` warps each (one per segment), the
// partials in shared memory (part, sketch_part and tile_done unused); else blocks of kTileWarps warps over the
// (tile, segment) tasks, the partials in `part` ([rows][segs]) and `sketch_part` ([rows][segs][32]), and, with
// g.fold_inline, a counter per tile in `tile_done` (zero before, left at zero). programmatic: launched as a
// programmatic dependent of the stream's previous kernel.
void launch_probe_tiles(bool block_fold, unsigned blocks, int warps, const ProbeStatsArgs& a, const TileGeometry& g,
                        RowPartial* part, float* sketch_part, unsigned* tile_done, bool programmatic,
                        cudaStream_t stream);
// The fold kernel: kFoldRowWarps warps a block, a warp a row.
constexpr int kFoldRowWarps = 8;
inline int64_t fold_row_blocks(int64_t rows) { return (rows + kFoldRowWarps - 1) / kFoldRowWarps; }
// The rows' records from the tile kernel's partials, when it does not fold them itself (!g.fold_inline).
void launch_probe_fold_rows(const ProbeStatsArgs& a, const TileGeometry& g, const RowPartial* part,
                            const float* sketch_part, cudaStream_t stream);
// Several tensors' tile kernels (the task kind) in one launch, and their fold kernels in another: task i's blocks
// are [first_block, next task's first_block); the same partials and records as each tensor's own launch.
// A batch also takes narrow tensors' rows (row_parts > 0; g, part, sketch_part and tile_done unused): kTileWarps
// warps a block, each the row kernel's warp of the same index (row_parts warps a row).
struct TileBatchTask {
  ProbeStatsArgs a;
  TileGeometry g;
  RowPartial* part;
  float* sketch_part;
  unsigned* tile_done;
  unsigned first_block;
  int row_parts = 0;
};
// A tensor's task launch as a batch's entry: its arguments, geometry and the places of its partials and tile
// counters in its workspace (first_block 0). The blocks it takes: task_blocks.
TileBatchTask task_launch(const ProbeStatsArgs& a, const TileGeometry& g);
int64_t task_blocks(const TileGeometry& g);
constexpr int kTileBatchMax = 22;  // a launch's parameters stay under the 4 KB every CUDA version takes
// A batch is passed by value as a kernel parameter: up to kTileBatchSmall tasks in a kernel whose parameters hold
// that many (a stage's few tensors; a larger parameter block costs each launch time on the device), else up to
// kTileBatchMax.
constexpr int kTileBatchSmall = 4;
template <int N>
struct TileBatchOf {
  int n = 0;
  TileBatchTask task[N];
};
using TileBatch = TileBatchOf<kTileBatchMax>;
static_assert(sizeof(TileBatch) <= 4000, "a batch is passed by value as a kernel parameter");
void launch_probe_tiles_batch(const TileBatch& b, unsigned blocks, bool programmatic, cudaStream_t stream);
void launch_probe_fold_rows_batch(const TileBatch& b, unsigned blocks, cudaStream_t stream);
// The row kernel: a warp per token row, the unit of stats the row; `sms`: the device's multiprocessors.
void launch_probe_rows(const ProbeStatsArgs& a, int sms, cudaStream_t stream);
// How many warps share a row's sketch lanes in the row kernel (1, 2, 4 or 8; 1 without the sketch): as many as
// keep about kRowSplitWarpsPerSm warps per SM, at most kRowMaxSketchParts. No more, since each of a row's warps
// reads the whole row (from L2 but for the first), and beyond a few warps per SM a warp a row already keeps the SMs
// busy (T 512's 512 rows of idx_scores took 27% longer split in 8).
constexpr int kRowMaxSketchParts = 8;
constexpr int64_t kRowSplitWarpsPerSm = 4;
int probe_rows_parts(const ProbeStatsArgs& a, int sms);

}  // namespace mla::cuda
