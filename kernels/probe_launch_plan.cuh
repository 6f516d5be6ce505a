// What the host keeps to launch the probe kernels (probe_launch_plan.cpp): the tile kernel's geometry per shape, and
// the device's answers behind it (SM count, the tile kernel's occupancy, the compute capability), each computed once
// and kept, since every probe of every layer asks again for the same shapes. Each rank's RankContext owns one, used
// from the thread that drives the rank; the answers are per device (the current one when asked).
#pragma once
#include <cstdint>
#include <map>
#include <tuple>

#include "kernels/probe_kernels.cuh"
#include "kernels/probe_stats.cuh"

namespace mla::cuda {

class ProbeLaunchCache {
 public:
  // The tile kernel's geometry for `a` (segments 0: the row kernel takes it), per (device, shape).
  TileGeometry tile_geometry(const ProbeStatsArgs& a);
  // probe_tiles_occupancy, per (device, kind of block, warps).
  TileOccupancy tile_occupancy(bool block_fold, int warps);
  // Whether the current device has compute capability 9 or later (programmatic dependent launches).
  bool supports_programmatic_launches();

 private:
  std::map<std::tuple<int, int, int64_t, int64_t, int, bool>, TileGeometry> geometry_;
  std::map<std::tuple<int, bool, int>, TileOccupancy> occupancy_;
  std::map<int, bool> sm90_;
};

}  // namespace mla::cuda
