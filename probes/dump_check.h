// What the dump reader checks a dump's contents against (docs/dump-format.md: what the reader refuses): the probes
// and weights of the graph the dump pins down, the dtypes a record may carry, an fp8 record's checksum, and the
// agreement of a record's norms. Shared by the reader's files (dump_read.cpp, dump_records.cpp); not an
// interface: probes/dump.h is.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "probes/dump.h"

namespace mla::dump_detail {

// The root's engine_dtype: the activations' precision, which tolerances are calibrated for.
inline constexpr const char* kEngineDtypes = "fp32|bf16|fp16";
// A record's dtype (and its probe's engine_dtype): the format the producer held the tensor in, whose bit patterns
// the checksum covers. fp8 records come from captures of engines that keep some activations in fp8.
inline constexpr const char* kRecordDtypes = "fp32|bf16|fp16|fp8_e4m3|fp8_e5m2";

// "" (not given) or one of `allowed` ("a|b|c").
void check_dtype(const std::string& where, const char* attr, const std::string& v, const char* allowed);

// The checksum of an fp8 record (its data as float32 values, which fp8 holds exactly): the 8-bit codes in place of
// compute_probe_record's 16/32-bit patterns; NaN counts as sign|0x7f (e4m3) or sign|0x7e (e5m2).
uint64_t fp8_checksum(const Tensor& t, int64_t T, const std::string& dtype, const std::string& where);

// The probes a dump may hold and what each must look like, from as much of the graph as the dump pins down: its
// model and run options (one graph: every attribute exact), its model alone (every graph of that model: shapes
// but the token axis, rope_from; stages of either form), or neither (the names, contracts, heads axes, stages and
// ranks of every graph of every model).
struct ProbeTable {
  std::string basis;   // "the graph of the dump's model and run options (...)" for messages
  bool exact = false;  // one graph: shapes with the token axis, and orders
  bool dims = false;   // the model's dimensions: shapes but the token axis, rope_from
  std::map<std::string, std::vector<ProbeSpec>> by_name;
  std::string names;   // "x, q_a, ..." in graph order, for messages
  bool weights = false;  // the table of layer weights (build_weights), not of probes
};

// The table of `cfg` and `spec` (either may be null: what every graph they leave open shares); `weights`: of the
// layer weights (build_weights), else of the probes.
ProbeTable make_probe_table(const MlaConfig* cfg, const RunSpec* spec, bool weights = false);

// The probe's attributes against the table's expectations for its name.
void check_against_graph(const DumpProbe& p, const ProbeTable& t, const std::string& w);

// The norms a record stores are of one tensor: l2 is the root of the sum of the squared token_l2 (its rows), and
// each token's head_l2 add up the same way to its token_l2. Written by any writer from one tensor they agree to
// rounding (float rows, double sums); a record that disagrees by more than 1e-3 was edited or written from two
// tensors, and a compare that reads l2 in one place and token_l2 in another would judge two different things.
// Skipped where a non-finite value makes the norms non-finite.
void check_norms_agree(const std::string& w, const ProbeRecord& rec);

}  // namespace mla::dump_detail
