// A bisect's FP32 reference run made in the bisect's own process (its candidate runs in a child): it writes the dump
// `mla-bisect run --engine reference --out PATH` writes with the same run options, record for record, and keeps
// every probe in full in memory, which calibration's FP32 side and the drill-down read instead of running it again.
#pragma once
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "core/model/inputs.h"
#include "core/model/weights.h"
#include "core/probe/probe.h"
#include "probes/dump.h"

namespace mla {

// `plan`: the run options' probe plan (what the dump at `path` records, weights included); `meta`: its meta
// (harness/run/run_meta.h). Returns every probe in full (no weights), as run_in_process would.
Dump run_reference_here(Engine& engine, const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& w,
                        const Inputs& in, const ProbePlan& plan, const DumpMeta& meta, const std::string& path);

}  // namespace mla
