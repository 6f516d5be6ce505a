// Weight comparison and description (weight_diff.h). A weight is compared as a probe whose rows play the tokens'
// part: gathered to the checkpoint's [out, in] layout, measured on full tensors or sketches, held against its
// tolerance. What differs is then described by rules that each read their own evidence, most specific first.
#include "harness/compare/weight_diff.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "harness/compare/format.h"
#include "core/model/progress_hook.h"

namespace mla {

namespace {

std::string num(double v, int precision = 3) {
  std::ostringstream os;
  os.precision(precision);
  os << v;
  return os.str();
}

// Relative difference of two records of the same tensor shard: full data where both have it, else sketches, else
// l2. -1 when the records cannot be compared (different shapes).
double record_rel(const ProbeRecord& a, const ProbeRecord& b) {
  if (a.shape != b.shape) return -1;
  double d = 0, n = 0;
  if (a.data.numel() > 0 && a.data.numel() == b.data.numel()) {
    for (int64_t i = 0; i < a.data.numel(); ++i) {
      const double x = a.data.data[i], y = b.data.data[i];
      d += (x - y) * (x - y);
      n += y * y;
    }
    return rel_of_sums(d, n);
  }
  if (!a.sketch.empty() && a.sketch.size() == b.sketch.size()) {
    for (size_t i = 0; i < a.sketch.size(); ++i) {
      const double x = a.sketch[i], y = b.sketch[i];
      d += (x - y) * (x - y);
      n += y * y;
    }
    return rel_of_sums(d, n);
  }
  return b.l2 > 0 ? std::fabs(a.l2 - b.l2) / b.l2 : -1;
}

// Whether the full data of two records agree within `tol` relative (record_rel <= tol): the sum of squared
// differences stops as soon as it passes tol² · Σb² (Σb² from the record's own l2), so two unrelated tensors are told
// apart after a few elements rather than a pass over both.
bool data_within(const ProbeRecord& a, const ProbeRecord& b, double tol) {
  const double limit = tol * tol * b.l2 * b.l2;
  const int64_t n = a.data.numel();
  const float* x = a.data.ptr();
  const float* y = b.data.ptr();
  double d = 0;
  for (int64_t i0 = 0; i0 < n; i0 += 4096) {
    const int64_t i1 = std::min(n, i0 + 4096);
    for (int64_t i = i0; i < i1; ++i) {
      const double e = static_cast<double>(x[i]) - y[i];
      d += e * e;
    }
    if (!(d <= limit)) return false;
  }
  return true;
}

// Whether two records hold the same values though their sketches were drawn for other names (a weight under
// another name): the tensors where both have them, else the statistics, each within `tol` relative.
bool same_values(const ProbeRecord& a, const ProbeRecord& b, double tol) {
  if (a.shape != b.shape) return false;
  if (a.data.numel() > 0 && a.data.numel() == b.data.numel()) return data_within(a, b, tol);
  const auto close = [&](double x, double y) { return std::fabs(x - y) <= tol * std::max(std::fabs(y), 1e-30); };
  return close(a.l2, b.l2) && close(a.absmax, b.absmax) && close(a.std, b.std) &&
         std::fabs(a.mean - b.mean) <= tol * std::max(b.std, 1e-30);
}

// Whether `a` holds `b`'s values within `tol` (another rank's block of a sharded weight): the elements where both
// records have them; else the sketches where they were drawn for the same columns; else the norms (for sketches drawn
// for other columns, another rank's block of a columns-sharded weight).
bool shard_within(const ProbeRecord& a, const ProbeRecord& b, bool same_columns, double tol) {
  if (a.shape != b.shape) return false;
  if (a.data.numel() > 0 && a.data.numel() == b.data.numel()) return data_within(a, b, tol);
  const double x = same_columns ? record_rel(a, b) : b.l2 > 0 ? std::fabs(a.l2 - b.l2) / b.l2 : -1;
  return x >= 0 && x <= tol;
}

std::vector<int64_t> over(const std::vector<double>& v, double limit) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i)
    if (!(v[i] <= limit)) out.push_back(static_cast<int64_t>(i));
  return out;
}

// Heads of the model the dump was made for (0: not known).
int64_t heads_of(const Dump& d) {
  try {
    return d.meta.model.is_null() ? 0 : d.config().heads;
  } catch (const std::exception&) {
    return 0;
  }
}

// Rows per head of a rows-sharded weight (q_b_proj: P+R, kv_b_proj: P+V), 0 when unknown.
int64_t rows_per_head(const DumpProbe& p, int64_t heads) {
  return heads > 0 && p.shape[0] % heads == 0 ? p.shape[0] / heads : 0;
}

struct BlockFit {
  int64_t block = 0;
  int64_t blocks = 0, off = 0;  // blocks in the tensor, blocks beyond tolerance
  double within = 1;            // residual after one factor per block, relative to the whole error
  double factor_spread = 0;     // max/min of the per-block factors of the off blocks
  std::vector<int64_t> off_rows, off_cols;  // block rows and columns that hold off blocks
};

// The four sums a block's fit needs: Σab, Σb², Σa², Σ(a-b)² over the block (a candidate, b reference).
struct BlockSums {
  double ab = 0, bb = 0, aa = 0, dd = 0;
  void add(const BlockSums& o) {
    ab += o.ab;
    bb += o.bb;
    aa += o.aa;
    dd += o.dd;
  }
};

// The sums of every 16 x 16 block (the last row and column of blocks partial), in one pass over both tensors.
struct BlockGrid {
  int64_t block = 16, rows = 0, cols = 0;  // blocks down and across
  std::vector<BlockSums> sums;             // [rows, cols]
};

BlockGrid block_sums_16(const Tensor& a, const Tensor& b) {
  BlockGrid g;
  const int64_t R = b.shape[0], C = b.shape[1];
  g.rows = (R + 15) / 16;
  g.cols = (C + 15) / 16;
  g.sums.resize(g.rows * g.cols);
  for (int64_t r = 0; r < R; ++r) {
    const float* x = a.ptr() + r * C;
    const float* y = b.ptr() + r * C;
    BlockSums* row = g.sums.data() + (r / 16) * g.cols;
    for (int64_t j = 0; j < g.cols; ++j) {
      BlockSums s;
      for (int64_t c = j * 16; c < std::min(C, (j + 1) * 16); ++c) {
        const double xv = x[c], yv = y[c];
        s.ab += xv * yv;
        s.bb += yv * yv;
        s.aa += xv * xv;
        s.dd += (xv - yv) * (xv - yv);
      }
      row[j].add(s);
    }
  }
  return g;
}

// The grid of blocks twice as large: each sums the 2 x 2 blocks it covers.
BlockGrid coarser(const BlockGrid& f) {
  BlockGrid g;
  g.block = 2 * f.block;
  g.rows = (f.rows + 1) / 2;
  g.cols = (f.cols + 1) / 2;
  g.sums.resize(g.rows * g.cols);
  for (int64_t i = 0; i < f.rows; ++i)
    for (int64_t j = 0; j < f.cols; ++j) g.sums[(i / 2) * g.cols + j / 2].add(f.sums[i * f.cols + j]);
  return g;
}

// Fits one factor per block of the grid (candidate ≈ f · reference within the block). A block-scale bug leaves a
// residual near zero with factors that vary; other bugs do not.
BlockFit fit_blocks(const BlockGrid& g, double tol) {
  BlockFit f;
  f.block = g.block;
  f.blocks = g.rows * g.cols;
  double resid = 0, total = 0, lo = INFINITY, hi = 0;
  std::vector<bool> row_off(g.rows), col_off(g.cols);
  for (int64_t i = 0; i < g.rows; ++i)
    for (int64_t j = 0; j < g.cols; ++j) {
      const BlockSums& s = g.sums[i * g.cols + j];
      total += s.dd;
      const double k = s.bb > 0 ? s.ab / s.bb : 0;
      resid += std::max(0.0, s.aa - 2 * k * s.ab + k * k * s.bb);
      if (rel_of_sums(s.dd, s.bb) > tol) {
        ++f.off;
        row_off[i] = col_off[j] = true;
        if (k != 0) {
          lo = std::min(lo, std::fabs(k));
          hi = std::max(hi, std::fabs(k));
        }
      }
    }
  f.within = total > 0 ? resid / total : 0;
  f.factor_spread = lo > 0 && std::isfinite(lo) ? hi / lo : INFINITY;
  for (int64_t i = 0; i < g.rows; ++i)
    if (row_off[i]) f.off_rows.push_back(i);
  for (int64_t j = 0; j < g.cols; ++j)
    if (col_off[j]) f.off_cols.push_back(j);
  return f;
}

}  // namespace

void compare_weights(const Dump& a, const Dump& b, const ToleranceModel& tol, const CompareOptions& opt,
                     CompareReport& rep) {
  if (a.weights.empty() || b.weights.empty()) {
    if (!a.weights.empty() || !b.weights.empty())
      rep.notes.push_back(std::string("weights not compared: the ") + (a.weights.empty() ? "candidate" : "reference") +
                          " recorded none");
    return;
  }
  std::string lacking;
  double done = 0;  // for the progress ticks
  for (const auto& pb : b.weights) {
    if (progress_wanted())
      progress_tick("weights", "comparing layer " + std::to_string(pb.layer) + " weight " + pb.name, done,
                    static_cast<double>(b.weights.size()));
    ++done;
    const DumpProbe* pa = a.find_weight(pb.layer, pb.name);
    if (!pa || pa->ranks.empty() || pb.ranks.empty()) {
      lacking += (lacking.empty() ? "" : ", ") + ("layer" + std::to_string(pb.layer) + "/" + pb.name);
      continue;
    }
    ProbeResult r;
    r.weight = true;
    r.layer = pb.layer;
    r.name = pb.name;
    r.stage = pb.stage;
    r.contract = pb.contract;
    r.shape = pb.shape;
    r.order = pb.order;
    r.multi_layer = b.weights.back().layer > 0;
    r.tol = tol.for_probe("weights/" + pb.name, pb.layer);
    if (pa->shape != pb.shape) {
      r.verdict = Verdict::Verdict_diverge;
      r.why = "shape " + shape_string(pa->shape) + " vs " + shape_string(pb.shape);
      r.pattern = "a different tensor: shape " + shape_string(pa->shape) + " where the reference has " +
                  shape_string(pb.shape);
      rep.weights.push_back(std::move(r));
      continue;
    }
    const Gathered ga = gather(*pa), gb = gather(pb);
    for (auto& s : ga.problems) r.problems.push_back("candidate: " + s);
    for (auto& s : gb.problems) r.problems.push_back("reference: " + s);
    r.m = compare_gathered(ga, gb, pb, pb.layer, opt);
    if (pa->ranks.size() == pb.ranks.size())
      for (size_t k = 0; k < pb.ranks.size(); ++k) {
        const double x = record_rel(pa->ranks[k], pb.ranks[k]);
        r.m.rank_rel.push_back(x);
        if (x > r.tol.rel_l2) r.ranks_off.push_back(static_cast<int>(k));
      }
    judge(r, ga, "row");
    if (r.verdict != Verdict::Verdict_pass) describe_weight(r, a, b, &ga, &gb);
    rep.weights.push_back(std::move(r));
  }
  if (!lacking.empty()) rep.notes.push_back("weights the candidate did not record, not compared: " + lacking);
  for (size_t i = 0; i < rep.weights.size(); ++i)
    if (rep.weights[i].verdict == Verdict::Verdict_diverge || rep.weights[i].verdict == Verdict::Verdict_nonfinite) {
      rep.first_weight = static_cast<int>(i);
      break;
    }
}

void describe_weight(ProbeResult& r, const Dump& a, const Dump& b, const Gathered* ga_given, const Gathered* gb_given) {
  const DumpProbe* pa = a.find_weight(r.layer, r.name);
  const DumpProbe* pb = b.find_weight(r.layer, r.name);
  r.evidence.clear();
  r.pattern.clear();
  if (!pa || !pb) return;
  const Metrics& m = r.m;
  const int tp = static_cast<int>(pb->ranks.size());
  const bool full = m.basis == "full";
  const std::string basis = full ? "" : " (estimated from sketches)";
  r.evidence.push_back("rel_l2 " + num(m.rel_l2) + " (tolerance " + num(r.tol.rel_l2) + "), norm ratio " +
                       num(m.norm_ratio, 4) + ", cosine " + num(m.cosine, 5) + basis);
  // Where: ranks, rows (heads for a rows-sharded weight), column blocks.
  if (tp > 1 && !r.ranks_off.empty()) {
    std::vector<int64_t> v(r.ranks_off.begin(), r.ranks_off.end());
    r.evidence.push_back("ranks off: " + ranges(v) + " of 0.." + std::to_string(tp - 1));
  }
  const auto rows_off = over(m.token_rel, r.tol.token_rel);
  const int64_t R = pb->shape[0], C = pb->shape.size() > 1 ? pb->shape[1] : 1;
  std::string rows_text;
  if (!rows_off.empty()) {
    rows_text = rows_off.size() == static_cast<size_t>(R) ? "every row" : "rows " + ranges(rows_off, 6);
    std::string heads_text;
    if (const int64_t per = rows_per_head(*pb, heads_of(b)); per > 0 && pb->contract == "rows") {
      std::vector<int64_t> heads;
      for (int64_t row : rows_off)
        if (heads.empty() || heads.back() != row / per) heads.push_back(row / per);
      heads_text = " (heads " + ranges(heads) + ", " + std::to_string(per) + " rows each)";
    }
    r.evidence.push_back(std::to_string(rows_off.size()) + " of " + std::to_string(R) + " rows off: " + rows_text +
                         heads_text + basis);
  }
  std::string cols_text;
  if (full && C >= 32) {
    const int64_t block = C >= 512 ? 128 : C >= 128 ? 32 : 16;
    const auto blocks = channel_block_rel(m.channel_err2, m.channel_ref2, block);
    const auto off = over(blocks, r.tol.rel_l2);
    if (!off.empty() && off.size() < blocks.size()) {
      cols_text = "column blocks " + ranges(off, 8) + " of " + std::to_string(blocks.size()) + " (" +
                  std::to_string(block) + " columns each)";
      r.evidence.push_back(cols_text + " off");
    }
  }
  const auto say = [&](const std::string& pattern) {
    r.pattern = pattern;
  };
  // NaN or Inf in the weight itself.
  if (!m.nonfinite_agree) {
    say("NaN/Inf in the weight: " + m.first_nonfinite);
    return;
  }
  // A tensor under the wrong name: the candidate's record is the reference's record of another weight.
  for (const auto& other : b.weights) {
    if (other.layer != r.layer || other.name == r.name || other.shape != pb->shape || other.ranks.size() != pa->ranks.size())
      continue;
    bool same = true;
    for (size_t k = 0; k < other.ranks.size() && same; ++k) same = same_values(pa->ranks[k], other.ranks[k], r.tol.rel_l2);
    if (same) {
      say("a tensor mapped to the wrong name: the candidate's " + r.name + " is the reference's " + other.name);
      return;
    }
  }
  // A tp shard sliced wrong: a rank holds another rank's block.
  if (tp > 1 && (pb->contract == "rows" || pb->contract == "columns") && pa->ranks.size() == pb->ranks.size()) {
    std::string found;
    for (int k : r.ranks_off)
      for (int j = 0; j < tp; ++j) {
        if (j == k) continue;
        if (shard_within(pa->ranks[k], pb->ranks[j], pb->contract == "rows", r.tol.rel_l2)) {
          found += (found.empty() ? "" : ", ") + std::string("rank ") + std::to_string(k) + " holds rank " +
                   std::to_string(j) + "'s block";
          break;
        }
      }
    if (!found.empty()) {
      say("sharding: a tp shard sliced at the wrong offset (" + found + " of the " + pb->contract + " split)");
      return;
    }
  }
  // A pure scale: the same content, another size.
  if (m.cosine > 1 - 1e-5 && std::fabs(m.norm_ratio - 1) > r.tol.rel_l2) {
    say("pure scale: the candidate's weight is the reference's times " + num(m.norm_ratio, 5) +
        " (a global or per-tensor scale applied wrongly: multiplied for divided, or twice)");
    return;
  }
  if (full && pb->shape.size() == 2) {
    Gathered ga_own, gb_own;
    if (!ga_given) ga_own = gather(*pa);
    if (!gb_given) gb_own = gather(*pb);
    const Gathered& ga = ga_given ? *ga_given : ga_own;
    const Gathered& gb = gb_given ? *gb_given : gb_own;
    if (ga.full && gb.full) {
      // Transposed: a square weight read in the other order.
      if (R == C) {
        double d = 0, n = 0;
        for (int64_t i = 0; i < R; ++i)
          for (int64_t j = 0; j < C; ++j) {
            const double x = ga.data.data[i * C + j], y = gb.data.data[j * C + i];
            d += (x - y) * (x - y);
            n += y * y;
          }
        if (rel_of_sums(d, n) <= r.tol.rel_l2) {
          say("transposed: the candidate's [" + std::to_string(R) + ", " + std::to_string(C) +
              "] weight is the reference's read in the other order");
          return;
        }
      }
      // Block-shaped: one factor per block explains the error (block scales read from the wrong block). The
      // largest block size first; the sums of all four from one pass.
      std::vector<BlockGrid> grids = {block_sums_16(ga.data, gb.data)};
      while (grids.back().block < 128) grids.push_back(coarser(grids.back()));
      for (auto g = grids.rbegin(); g != grids.rend(); ++g) {
        const int64_t B = g->block;
        if (B > std::min(R, C) / 2 && B > 16) continue;
        const BlockFit f = fit_blocks(*g, r.tol.rel_l2);
        // Within 5% of the error left: a bf16 candidate's rounding stays inside the blocks.
        if (f.off >= 2 && f.within < 0.05 && f.factor_spread > 1 + r.tol.rel_l2) {
          say("block-shaped: " + std::to_string(f.off) + " of " + std::to_string(f.blocks) + " " + std::to_string(B) +
              "x" + std::to_string(B) + " blocks off, each by one factor (factors " + num(f.factor_spread, 3) +
              "x apart): block scales applied to the wrong blocks (scale layout, e.g. transposed)");
          r.evidence.push_back("block rows " + ranges(f.off_rows, 8) + ", block columns " + ranges(f.off_cols, 8) +
                               "; one factor per block leaves " + num(100 * f.within, 2) + "% of the error");
          return;
        }
      }
    }
  }
  if (!rows_text.empty() && rows_off.size() < static_cast<size_t>(R)) {
    say("part of the weight differs: " + rows_text + (cols_text.empty() ? "" : ", " + cols_text));
    return;
  }
  // Content in the wrong places: norms kept, values moved (element or nibble order, a layout).
  if (std::fabs(m.norm_ratio - 1) < 0.1 && m.cosine < 0.9) {
    say("content off, norms similar: values in the wrong places (element or nibble order within blocks, a layout)");
    return;
  }
  say("differs (no known pattern)" + std::string(full ? "" : "; full tensors (--full-probes weights) would tell more"));
}

const ProbeResult* weight_cause(const CompareReport& rep, const ProbeResult& probe) {
  Stage at;
  try {
    at = parse_stage(probe.stage);
  } catch (const std::exception&) {
    return nullptr;
  }
  for (const auto& w : rep.weights) {
    if (w.verdict != Verdict::Verdict_diverge && w.verdict != Verdict::Verdict_nonfinite) continue;
    if (w.layer > probe.layer) continue;
    try {
      // The stage enum runs in execution order.
      if (w.layer < probe.layer || static_cast<int>(parse_stage(w.stage)) <= static_cast<int>(at)) return &w;
    } catch (const std::exception&) {
    }
  }
  return nullptr;
}


std::string weight_sentence(const ProbeResult& r) {
  std::string s = r.label() + " differs";
  if (!r.ranks_off.empty() && r.m.rank_rel.size() > 1) {
    std::vector<int64_t> v(r.ranks_off.begin(), r.ranks_off.end());
    s += " on rank" + std::string(v.size() == 1 ? " " : "s ") + ranges(v);
  }
  s += " (" + r.why + ")";
  if (!r.pattern.empty()) s += ": " + r.pattern;
  return s;
}

}  // namespace mla
