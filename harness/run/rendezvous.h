// The bootstrap of one process per rank: rank 0 publishes a communicator id (the CUDA engine's ncclUniqueId,
// 128 bytes) in a file every process can see; the other ranks wait for that file and read the id back.
//
// File: [8 bytes magic "MLARDV01"][u32 length][u32 crc32 of the id][the id: length bytes], little-endian. Rank 0
// writes it to PATH.tmp.PID, fsyncs, and links (or renames) it into place, so a reader sees the whole file or none.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "core/engine/process_rank.h"

namespace mla {

// Rank 0: refuses (UsageError) a `path` that exists before the launch, calls make_id() (which must return `bytes`
// bytes), publishes them at `path` and returns them. Any other rank: polls `path` every 20 ms until it holds a
// complete id of `bytes` bytes and returns that; after `timeout_s` seconds an EngineError naming the path, the
// rank and the seconds waited. A file that is not a rendezvous file, or holds an id of another length, is a
// UsageError at once; one that stays incomplete (torn) is reported as such at the timeout.
std::vector<unsigned char> rendezvous_exchange(const std::string& path, int rank, size_t bytes,
                                               const std::function<std::vector<unsigned char>()>& make_id,
                                               double timeout_s);

// One process per rank (`run --rank`), before the engine prepares: rank 0 draws the launch id (16 random bytes, in
// hex) and makes the engine's communicator id (`comm_bytes` bytes, by make_comm_id), and publishes both at
// p.rendezvous; every other rank reads them there. A launch of one process draws its id alone. Fills p.launch_id
// and p.comm_id. Errors as rendezvous_exchange's.
void rendezvous_launch(ProcessRank& p, size_t comm_bytes, const std::function<std::vector<unsigned char>()>& make_comm_id);

}  // namespace mla
