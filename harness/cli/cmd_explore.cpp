// `mla-bisect explore CANDIDATE.h5 REFERENCE.h5`: the interactive form of compare and bisect. Commands come from
// a terminal (a prompt and a small built-in line editor: no readline dependency) or from stdin (a script or a
// here-document: no prompt, nothing echoed), and go to harness/explore/explore.h.
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "harness/cli/commands.h"
#include "harness/cli/run_options.h"
#include "harness/explore/explore.h"
#include "core/model/errors.h"
#include "harness/report/compare_report.h"
#include "harness/report/progress.h"
#include "harness/run/tolerance_for.h"
#include "probes/full_sidecar.h"

namespace mla::cli {

std::map<std::string, double> parse_tol_overrides(const std::vector<std::string>& items);

namespace {

// Just enough line editing for a debugging session: cursor movement, history, kill, tab completion.
// The terminal is raw only while a line is being read, so command output and Ctrl-C behave as usual.
class LineEditor {
 public:
  using Completer = std::function<std::vector<std::string>(const std::string&)>;
  LineEditor(int in_fd, int out_fd, Completer complete) : in_(in_fd), out_(out_fd), complete_(std::move(complete)) {}

  // False at end of input (Ctrl-D on an empty line, or the terminal went away).
  bool read_line(const std::string& prompt, std::string& line) {
    termios orig{};
    if (tcgetattr(in_, &orig) != 0) return fallback(prompt, line);
    termios raw = orig;
    raw.c_iflag &= ~(ICRNL | IXON | BRKINT | INPCK | ISTRIP);
    raw.c_lflag &= ~(ECHO | ICANON | ISIG | IEXTEN);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    // TCSANOW, not TCSAFLUSH: keys typed ahead (or sent by tmux) before the prompt must not be lost.
    if (tcsetattr(in_, TCSANOW, &raw) != 0) return fallback(prompt, line);
    const bool ok = edit(prompt, line);
    tcsetattr(in_, TCSANOW, &orig);
    return ok;
  }

 private:
  bool fallback(const std::string& prompt, std::string& line) {
    put(prompt);
    return static_cast<bool>(std::getline(std::cin, line));
  }

  void put(const std::string& s) {
    size_t done = 0;
    while (done < s.size()) {
      const ssize_t n = ::write(out_, s.data() + done, s.size() - done);
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }

  bool get(char& c) { return ::read(in_, &c, 1) == 1; }

  void refresh(const std::string& prompt) {
    std::string s = "\r" + prompt + buf_ + "\x1b[K";
    if (pos_ < buf_.size()) s += "\x1b[" + std::to_string(buf_.size() - pos_) + "D";
    put(s);
  }

  void set(std::string text) {
    buf_ = std::move(text);
    pos_ = buf_.size();
  }

  void tab(const std::string& prompt) {
    const std::string head = buf_.substr(0, pos_);
    const auto matches = complete_(head);
    if (matches.empty()) return;
    const size_t word_start = head.find_last_of(' ') == std::string::npos ? 0 : head.find_last_of(' ') + 1;
    const std::string word = head.substr(word_start);
    std::string common = matches[0];
    for (auto& m : matches) {
      size_t k = 0;
      while (k < common.size() && k < m.size() && common[k] == m[k]) ++k;
      common.resize(k);
    }
    if (matches.size() == 1) common += " ";
    if (common.size() > word.size()) {
      buf_.replace(word_start, word.size(), common);
      pos_ = word_start + common.size();
    } else {
      std::string list = "\r\n";
      for (auto& m : matches) list += m + "  ";
      put(list + "\r\n");
    }
    refresh(prompt);
  }

  bool edit(const std::string& prompt, std::string& line) {
    buf_.clear();
    pos_ = 0;
    size_t hist = history_.size();
    std::string stash;  // the line being typed while browsing history
    auto browse = [&](int dir) {
      if (dir < 0 && hist == 0) return;
      if (dir > 0 && hist >= history_.size()) return;
      if (hist == history_.size()) stash = buf_;
      hist += dir;
      set(hist == history_.size() ? stash : history_[hist]);
    };
    put(prompt);
    for (char c; get(c);) {
      switch (c) {
        case '\r':
        case '\n':
          put("\r\n");
          line = buf_;
          if (!line.empty() && (history_.empty() || history_.back() != line)) history_.push_back(line);
          return true;
        case 4:  // Ctrl-D
          if (buf_.empty()) {
            put("\r\n");
            return false;
          }
          if (pos_ < buf_.size()) buf_.erase(pos_, 1);
          break;
        case 3:  // Ctrl-C: drop the line
          put("^C\r\n");
          buf_.clear();
          pos_ = 0;
          hist = history_.size();
          break;
        case 127:
        case 8:
          if (pos_ > 0) buf_.erase(--pos_, 1);
          break;
        case 1: pos_ = 0; break;                        // Ctrl-A
        case 5: pos_ = buf_.size(); break;              // Ctrl-E
        case 2: if (pos_ > 0) --pos_; break;            // Ctrl-B
        case 6: if (pos_ < buf_.size()) ++pos_; break;  // Ctrl-F
        case 11: buf_.erase(pos_); break;               // Ctrl-K
        case 21:                                        // Ctrl-U
          buf_.erase(0, pos_);
          pos_ = 0;
          break;
        case 23: {  // Ctrl-W
          size_t k = pos_;
          while (k > 0 && buf_[k - 1] == ' ') --k;
          while (k > 0 && buf_[k - 1] != ' ') --k;
          buf_.erase(k, pos_ - k);
          pos_ = k;
          break;
        }
        case 12: put("\x1b[H\x1b[2J"); break;  // Ctrl-L
        case 16: browse(-1); break;            // Ctrl-P
        case 14: browse(+1); break;            // Ctrl-N
        case 9: tab(prompt); continue;
        case 27: {  // escape sequences: arrows, Home/End, Delete
          char a = 0, b = 0;
          if (!get(a) || !get(b)) return false;
          if (a == '[' && b >= '0' && b <= '9') {
            char t = 0;
            if (!get(t)) return false;
            if (t == '~') {
              if (b == '3' && pos_ < buf_.size()) buf_.erase(pos_, 1);
              if (b == '1' || b == '7') pos_ = 0;
              if (b == '4' || b == '8') pos_ = buf_.size();
            }
          } else if (a == '[' || a == 'O') {
            if (b == 'A') browse(-1);
            if (b == 'B') browse(+1);
            if (b == 'C' && pos_ < buf_.size()) ++pos_;
            if (b == 'D' && pos_ > 0) --pos_;
            if (b == 'H') pos_ = 0;
            if (b == 'F') pos_ = buf_.size();
          }
          break;
        }
        default:
          if (static_cast<unsigned char>(c) >= 32 && static_cast<unsigned char>(c) < 127) buf_.insert(pos_++, 1, c);
          break;
      }
      refresh(prompt);
    }
    put("\r\n");
    return false;
  }

  int in_, out_;
  Completer complete_;
  std::string buf_;
  size_t pos_ = 0;
  std::vector<std::string> history_;
};

struct ExploreCmdOptions {
  std::string a, b, tolerance = "auto", color = "auto";
  double k = 4.0;
  std::vector<std::string> tol;
  bool quiet = false;  // no progress lines on stderr
};

int run_explore(const ExploreCmdOptions& o) {
  // The setup (reading two dumps, calibrating) can take a while on large runs: progress lines on stderr, which the
  // session's own output (stdout) does not mix with.
  const ProgressLog log(!o.quiet);
  log.step("reading " + o.a);
  Dump a = read_dump(o.a);
  log.step("reading " + o.b);
  Dump b = read_dump(o.b);
  // Full tensors bisect kept beside the dumps (FILE.full.h5): taken where they equal the dumps' records.
  for (Dump* d : {&a, &b}) {
    const SidecarMerge m = merge_full_sidecar(*d);
    if (m.path.empty()) continue;
    if (!m.ignored.empty()) {
      std::cout << "note: " << m.path << " not used: " << m.ignored << "\n";
      continue;
    }
    if (!m.taken.empty()) {
      std::string list;
      for (const auto& t : m.taken) list += (list.empty() ? "" : ", ") + t;
      std::cout << "full tensors from " << m.path << " (kept by bisect, equal to the dump's records): " << list << "\n";
    }
    for (const auto& r : m.refused) std::cout << "note: " << m.path << ": not used for " << r << "\n";
  }
  require_every_rank(a, "explore");
  require_every_rank(b, "explore");
  require_comparable(a, b);  // before calibration: dumps of different shapes are refused, exit 2
  require_readable(a);
  require_readable(b);
  const std::string dtype = a.meta.engine_dtype.empty() ? "fp32" : a.meta.engine_dtype;
  const bool calibrating = o.tolerance == "calibrate" || (o.tolerance == "auto" && dtype != "fp32");
  const auto t0 = std::chrono::steady_clock::now();
  if (calibrating)
    std::cout << "calibrating tolerances: the reference at " << (dtype == "fp32" ? "bf16" : dtype)
              << " against fp32 on the reference dump's inputs (tolerance = " << fmt_num(o.k) << " x that noise floor) ..."
              << std::flush;
  if (calibrating) log.step("calibrating tolerances");
  ToleranceModel tol = tolerance_for(a, b, o.tolerance, o.k);
  tol.overrides = parse_tol_overrides(o.tol);
  log.step("ready");
  if (calibrating)
    std::cout << " done (" << fmt_num(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2)
              << " s)\n";

  const bool in_tty = isatty(STDIN_FILENO), out_tty = isatty(STDOUT_FILENO);
  ExploreStyle style;
  const char* term = std::getenv("TERM");
  style.color = o.color == "always" || (o.color == "auto" && out_tty && !std::getenv("NO_COLOR") &&
                                        !(term && std::string(term) == "dumb"));
  if (winsize ws{}; out_tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40)
    style.width = std::min<int>(80, ws.ws_col);
  Explorer ex(std::move(a), std::move(b), std::move(tol), std::cout, style);
  ex.print_intro();
  std::string line;
  if (in_tty) {
    LineEditor editor(STDIN_FILENO, out_tty ? STDOUT_FILENO : STDERR_FILENO,
                      [&ex](const std::string& l) { return ex.complete(l); });
    while (true) {
      std::cout.flush();
      if (!editor.read_line("explore> ", line) || !ex.execute(line)) break;
    }
  } else {
    while (std::getline(std::cin, line))
      if (!ex.execute(line)) break;
  }
  return ExitCode_ok;
}

}  // namespace

void setup_explore(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ExploreCmdOptions>();
  auto* cmd = app.add_subcommand(
      "explore", "Explore a divergence interactively: list probes, step through divergences, heat maps, slices, "
                 "worst elements, isolation. Reads commands from the terminal or from stdin (type help)");
  cmd->add_option("candidate", o->a, "Candidate dump (.h5)")->required();
  cmd->add_option("reference", o->b, "Reference dump (.h5)")->required();
  cmd->add_option("--tolerance", o->tolerance, "auto (calibrate unless the candidate is FP32), calibrate, or exact")
      ->capture_default_str();
  cmd->add_option("--tol-factor", o->k, "Tolerance = factor x calibrated noise floor")->capture_default_str()
      ->check(finite_number(0, true));
  cmd->add_option("--tol", o->tol, "Override a probe's tolerance: PROBE=REL_L2 (repeatable)");
  cmd->add_option("--color", o->color, "Heat-map colors: auto (when stdout is a terminal), always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}))
      ->capture_default_str();
  cmd->add_flag("--quiet", o->quiet, "No progress lines on stderr (reading the dumps, calibrating)");
  cmd->callback([o, &exit_code] { exit_code = run_explore(*o); });
}

}  // namespace mla::cli
