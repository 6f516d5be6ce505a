// `mla-bisect explore`: an interactive walk through a comparison of two dumps. The Explorer owns both dumps,
// their comparison and a cursor (the current probe); each command line prints to one stream. The terminal
// side (prompt, line editing) is in harness/cli/cmd_explore.cpp, so scripted sessions and tests drive the
// same object.
#pragma once
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness/compare/compare.h"

namespace mla {

struct ExploreStyle {
  bool color = false;    // ANSI colors (heat maps), unicode bars
  int width = 80;        // terminal columns for pictures
  int height = 40;       // rows of a heat map at most
};

class Explorer {
 public:
  // `candidate` and `reference` as read_dump gave them; `tol` from tolerance_for (with any overrides).
  Explorer(Dump candidate, Dump reference, ToleranceModel tol, std::ostream& out, ExploreStyle style = {});
  ~Explorer();

  void print_intro();
  // Runs one command line. Returns false for quit.
  bool execute(const std::string& line);
  // Completions of the last word of `line` (command names, then probe names) for the line editor.
  std::vector<std::string> complete(const std::string& line) const;
  const CompareReport& report() const { return rep_; }

  // Command names with a one-line description, in the order help prints them.
  static const std::vector<std::pair<std::string, std::string>>& commands();

 private:
  struct Sides;  // the two gathered tensors of one probe (cached)

  // PROBE, PROBE@LAYER, or empty for the current probe; -1 (and a message) when there is no such probe.
  int resolve(const std::string& probe, int layer = -1);
  const Sides& sides(int index);
  // The probe's metrics as every command reads them: the comparison's, and on dumps without full tensors the
  // per-head, per-(token, head) and per-rank maps estimated from the recorded sketches and per-head norms.
  const Metrics& metrics(int index);
  // What a number of metrics(index) rests on, in words: "full tensors", "estimate (from sketches/norms)", ...
  std::string basis_label(int index);
  // How to make the dumps that hold this probe in full (the runs' own command lines, with --full-probes).
  std::string how_to_get_full(int index) const;
  bool divergent(int index) const;
  void print_card(int index, const std::string& title);

  void cmd_list();
  void cmd_step(int direction);  // +1 next, -1 prev
  void cmd_first();
  void cmd_show(int index);
  void cmd_heads(int index);
  void cmd_tokens(int index);
  void cmd_ranks(int index);
  void cmd_channels(int index);
  void cmd_heatmap(int index);
  void cmd_slice(int index, const std::vector<std::string>& args);
  void cmd_worst(int index, int n);
  void cmd_isolate(int index);
  // The bug classes of an introducing stage re-run on the inputs its candidate read (harness/hypotheses).
  void search_causes(const Dump& inputs_dump, const Dump& outputs_dump, const MlaConfig& cfg, const RunSpec& spec,
                     const std::vector<LayerWeights>& weights, const Inputs& inputs, const ProbeResult& r);
  void cmd_help();

  Dump cand_, ref_;
  ToleranceModel tol_;
  CompareReport rep_;
  Batch batch_;
  std::ostream& os_;
  ExploreStyle style_;
  int cur_ = -1;
  std::map<int, std::unique_ptr<Sides>> sides_;
  std::map<int, Metrics> metrics_;  // metrics(index), made once
  std::optional<Dump> ref_full_;  // the FP32 reference run isolation feeds from (made once)
};

}  // namespace mla
