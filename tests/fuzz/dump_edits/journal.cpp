// fuzz_dump's journal edits: records of a dump's journal sidecar with fields overridden and bytes edited.
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/model/errors.h"
#include "core/model/stage_graph.h"
#include "probes/dump_internal.h"
#include "probes/journal.h"
#include "tests/fuzz/dump_edits/builder.h"
#include "tests/fuzz/dump_edits/values.h"

namespace fuzz_dump {

class Builder::Out {
 public:
  template <class T> void pod(const T& v) { b_.append(reinterpret_cast<const char*>(&v), sizeof(T)); }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    b_.append(s);
  }
  template <class T> void vec(const std::vector<T>& v) {
    pod<uint64_t>(v.size());
    b_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void tensor(const Tensor& t) {
    vec(t.shape);
    vec(t.data);
  }
  std::string take() { return std::move(b_); }

 private:
  std::string b_;
};

// Which of `nbits` fields an edit changes: mostly none or one, at times two.
uint32_t Builder::sparse_mask(int nbits) {
  const uint8_t c = byte();
  uint32_t m = 0;
  if (c >= 96) m |= 1u << (byte() % nbits);
  if (c >= 224) m |= 1u << (byte() % nbits);
  return m;
}

template <class T> void Builder::maybe_resize(std::vector<T>& v) {
  if (byte() % 4 == 0) v.resize(static_cast<size_t>(std::clamp<int64_t>(int_value(), 0, 5000)));
  if (!v.empty() && byte() % 4 == 0) v[f_.ConsumeIntegral<uint16_t>() % v.size()] = static_cast<T>(int_value());
}

void Builder::maybe_tensor(Tensor& t) {
  if (byte() % 4 == 0) t.shape = shape_value();
  if (byte() % 4 == 0) t.data.resize(static_cast<size_t>(std::clamp<int64_t>(int_value(), 0, 1 << 16)));
}

std::string Builder::header_payload() {
  const Dump& d = sc_.dump;
  const auto& m = d.meta;
  json j = {{"engine", m.engine},       {"engine_options", m.engine_options},
            {"engine_dtype", m.engine_dtype}, {"device", m.device},
            {"model", m.model},         {"run_options", m.run_options},
            {"tp", m.tp},               {"mode", m.mode},
            {"seed", m.seed},           {"inject", m.inject},
            {"probe_level", m.probe_level}, {"command", m.command},
            {"process_rank", m.process_rank}, {"processes", m.processes},
            {"launch_id", m.launch_id}, {"created_utc", d.created_utc},
            {"tool_version", d.tool_version}, {"git_sha", d.git_sha}};
  const uint32_t mask = sparse_mask(10);
  if (mask & 1) j["model"] = json::parse(json_text("model"), nullptr, false);
  if (mask & 2) j["run_options"] = json::parse(json_text("run_options"), nullptr, false);
  if (mask & 4)
    for (int n = byte() % 3 + 1; n > 0; --n) {
      static const char* const kKeys[] = {"tp", "process_rank", "processes", "mode", "engine_dtype",
                                          "probe_level", "seed", "engine", "launch_id"};
      j[pick(kKeys)] = json_value();
    }
  if (mask & 8) j.erase(pick(kRootAttrs));
  Out o;
  o.str(mask & 16 ? string_value() : std::string(journal::kHeaderMagic));
  o.pod<uint32_t>(mask & 32 ? static_cast<uint32_t>(int_value()) : journal::kVersion);
  o.str(mask & 64 ? f_.ConsumeRandomLengthString(128) : text(j));
  const bool inputs = d.has_inputs && !(mask & 128);
  o.pod<uint32_t>(inputs ? 1 : 0);
  if (inputs) {
    Inputs in = d.inputs;
    auto& b = in.batch;
    if (mask & 256) {
      maybe_tensor(in.x);
      maybe_resize(b.new_lens);
      maybe_resize(b.context_lens);
      maybe_resize(b.positions);
      maybe_resize(b.token_seq);
      maybe_resize(b.block_table);
      if (byte() % 4 == 0) b.max_blocks = static_cast<int>(int_value());
      if (byte() % 4 == 0) b.num_blocks = static_cast<int>(int_value());
      if (byte() % 4 == 0) in.kv_cache.resize(byte() % 4);
      for (auto& c : in.kv_cache) maybe_tensor(c);
      if (byte() % 4 == 0) in.index_cache.resize(byte() % 3);
    }
    o.tensor(in.x);
    o.vec(b.new_lens);
    o.vec(b.context_lens);
    o.vec(b.positions);
    o.vec(b.token_seq);
    o.vec(b.block_table);
    o.pod<int32_t>(b.max_blocks);
    o.pod<int32_t>(b.num_blocks);
    o.pod<uint64_t>(mask & 512 ? static_cast<uint64_t>(int_value()) : in.kv_cache.size());
    for (const auto& c : in.kv_cache) o.tensor(c);
    o.pod<uint64_t>(in.index_cache.size());
    for (const auto& c : in.index_cache) o.tensor(c);
  }
  return o.take();
}

std::string Builder::probe_payload(bool weight) {
  const auto& list = weight && !sc_.dump.weights.empty() ? sc_.dump.weights : sc_.dump.probes;
  const DumpProbe& p = list[f_.ConsumeIntegral<uint16_t>() % list.size()];
  int rank = static_cast<int>(byte() % p.ranks.size());
  ProbeRecord r = p.ranks[rank];
  DumpProbe q = p;
  const uint32_t mask = sparse_mask(18);
  int32_t level = static_cast<int32_t>(r.level);
  if (mask & 1) q.layer = static_cast<int>(int_value());
  if (mask & 2) rank = static_cast<int>(int_value());
  if (mask & 4) q.name = probe_name();
  if (mask & 8) q.stage = string_value();
  if (mask & 16) q.contract = string_value();
  if (mask & 32) q.shape = shape_value();
  if (mask & 64) q.order = static_cast<int>(int_value());
  if (mask & 128) q.heads_axis = static_cast<int>(int_value());
  if (mask & 256) q.rope_from = static_cast<int>(int_value());
  if (mask & 512) r.shape = shape_value();
  if (mask & 1024) r.dtype = string_value();
  if (mask & 2048) r.l2 = double_value(), r.absmax = double_value(), r.mean = double_value(), r.std = double_value();
  if (mask & 4096) r.nan = int_value(), r.inf = int_value();
  if (mask & 8192) maybe_resize(r.token_l2);
  if (mask & 16384) maybe_resize(r.head_l2);
  if (mask & 32768) maybe_resize(r.sketch);
  if (mask & 65536) level = static_cast<int32_t>(int_value());
  if (mask & 131072) maybe_tensor(r.data);
  Out o;
  o.pod<int32_t>(q.layer);
  o.pod<int32_t>(rank);
  o.str(q.name);
  o.str(q.stage);
  o.str(q.contract);
  o.vec(q.shape);
  o.pod<int32_t>(q.order);
  o.pod<int32_t>(q.heads_axis);
  o.pod<int32_t>(q.rope_from);
  o.vec(r.shape);
  o.str(r.dtype);
  o.pod<double>(r.l2);
  o.pod<double>(r.absmax);
  o.pod<double>(r.mean);
  o.pod<double>(r.std);
  o.pod<int64_t>(r.nan);
  o.pod<int64_t>(r.inf);
  o.pod<uint64_t>(r.checksum);
  o.vec(r.token_l2);
  o.vec(r.head_l2);
  o.vec(r.sketch);
  o.pod<uint32_t>(static_cast<uint32_t>(level));
  o.tensor(r.data);
  return o.take();
}

void Builder::journal_record() {
  static const char* const kNames[] = {"d.h5.journal", "d.h5.journal", "d.h5.journal", "d.h5.journal.tmp.999999",
                                       "d.rank0.h5.journal", "d.rank1.h5.journal"};
  const std::string jname = pick(kNames);
  std::string& j = journals_[jname];
  // A journal starts with its header (mostly).
  const uint8_t t = j.empty() && byte() % 8 ? 0 : byte() % 8;
  journal::RecordType type = journal::RecordType::RecordType_header;
  std::string payload;
  switch (t) {
    case 0:
    case 1: type = journal::RecordType::RecordType_header, payload = header_payload(); break;
    case 2:
    case 3: type = journal::RecordType::RecordType_probe, payload = probe_payload(false); break;
    case 4: type = journal::RecordType::RecordType_weight, payload = probe_payload(true); break;
    case 5: {
      type = journal::RecordType::RecordType_stage;
      Out o;
      o.pod<int32_t>(static_cast<int32_t>(int_value()));
      o.str(string_value());
      o.pod<int32_t>(static_cast<int32_t>(int_value()));
      payload = o.take();
      break;
    }
    case 6: {
      type = journal::RecordType::RecordType_finish;
      Out o;
      o.str(string_value());
      payload = o.take();
      break;
    }
    default:
      type = static_cast<journal::RecordType>(byte() % 7);
      payload = f_.ConsumeRandomLengthString(512);
  }
  // A few bytes of the payload changed under a good CRC (a decoder's input), then the frame whole or damaged.
  for (int n = byte() % 8 == 0 ? byte() % 4 + 1 : 0; n > 0 && !payload.empty(); --n)
    payload[f_.ConsumeIntegral<uint32_t>() % payload.size()] = static_cast<char>(byte());
  std::string fr = journal::frame(type, payload);
  trace("  journal " + jname + " record type " + std::to_string(static_cast<int>(type)) + ", " +
        std::to_string(payload.size()) + " bytes");
  switch (byte() % 16) {
    case 0: fr[fr.size() - 1] ^= 1; break;                                  // CRC
    case 1: fr.resize(fr.size() - 1 - byte() % std::min<size_t>(fr.size() - 1, 24)); break;  // truncated
    case 2: {  // a length beyond the file
      const uint64_t len = static_cast<uint64_t>(int_value());
      std::memcpy(fr.data() + 8, &len, 8);
      break;
    }
    case 3: fr = f_.ConsumeRandomLengthString(64); break;
    default: break;
  }
  j += fr;
}

}  // namespace fuzz_dump
