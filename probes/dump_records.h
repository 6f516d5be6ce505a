// Reading a probe's group of a dump (/layer{l}/{probe}, and a weight's under /weights) and its rank records,
// each checked against the graph the dump pins down (dump_check.h). Shared by the reader's files (dump_read.cpp
// reads the file around them); not an interface: probes/dump.h is.
#pragma once
#include <cstdint>
#include <string>

#include "probes/dump.h"
#include "probes/dump_check.h"
#include "probes/h5.h"

namespace mla::dump_detail {

// What read_probe needs of the dump around a probe.
struct ProbeContext {
  int tp = 1;
  int own = -1;           // the rank a one-rank dump holds (its only rank group), -1 for every rank
  bool complete = false;  // status "complete": every rank of every probe is there
  const ProbeTable* table = nullptr;
  const DumpReadOptions* opts = nullptr;
  bool weights = false;    // reading /weights: contracts replicated, rows, columns; rows are not tokens
  int64_t tokens = -1;     // T of every probe: /inputs/x's, else the first probe's (-1: not known yet)
  std::string tokens_from;  // where that T comes from, for messages
};

// /layer{l}/{name} (or a weight's group): its attributes, checked against ctx.table, and its rank records.
DumpProbe read_probe(const h5::Group& g, int layer, const std::string& name, const ProbeContext& ctx);

// layer{l} as write_file writes it (no sign or leading zeros).
bool parse_layer_name(const std::string& name, int* layer);

// /weights/layer{l}/{weight}/rank{r}: the same records as probes, checked against build_weights.
void read_weights(const h5::File& f, Dump& d, ProbeContext ctx, const MlaConfig* cfg, const RunSpec* spec);

}  // namespace mla::dump_detail
