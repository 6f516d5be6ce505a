// fork/exec with a timeout and captured output.
#include "harness/bisect/child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>

#include "core/model/errors.h"

namespace mla {

std::string ChildResult::describe() const {
  if (timed_out) return "timed out after " + std::to_string(static_cast<int>(seconds)) + " s and was killed";
  if (signal) return std::string("killed by signal ") + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return "exited with code " + std::to_string(exit_code);
}

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw UsageError("cannot find the mla-bisect binary (/proc/self/exe)");
  buf[n] = 0;
  return buf;
}

ChildResult run_child(const std::vector<std::string>& argv, double timeout_s, const std::vector<std::string>& env,
                      const std::function<bool(const std::string&)>& on_line) {
  // Arguments and environment made before fork: between fork and exec the child only calls what is safe after a
  // fork in a process with other threads (no allocation).
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_kept;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& x : env) replaced = replaced || x.compare(0, name.size() + 1, name + "=") == 0;
    if (!replaced) env_kept.push_back(entry);
  }
  env_kept.insert(env_kept.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& e : env_kept) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw UsageError(std::string("pipe: ") + strerror(errno));
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) throw UsageError(std::string("fork: ") + strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(fds[1]);
  ChildResult res;
  // The output as it comes: whole lines go past on_line (when given), the rest waits for its newline.
  std::string partial;
  const auto keep = [&](const char* data, size_t n, bool last) {
    if (!on_line) {
      res.output.append(data, n);
    } else {
      partial.append(data, n);
      size_t from = 0;
      for (size_t nl; (nl = partial.find('\n', from)) != std::string::npos; from = nl + 1) {
        const std::string line = partial.substr(from, nl - from);
        if (!on_line(line)) res.output += line + "\n";
      }
      partial.erase(0, from);
      if (last) res.output += partial;
    }
    if (res.output.size() > 65536) res.output.erase(0, res.output.size() - 65536);
  };
  char buf[4096];
  bool open = true;
  int status = 0;
  for (;;) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (timeout_s > 0 && elapsed > timeout_s && !res.timed_out) {
      res.timed_out = true;
      kill(-pid, SIGKILL);
    }
    if (open) {
      pollfd p{fds[0], POLLIN, 0};
      if (poll(&p, 1, 50) > 0) {
        const ssize_t n = read(fds[0], buf, sizeof buf);
        if (n > 0) {
          keep(buf, static_cast<size_t>(n), false);
        } else {
          open = false;
        }
      }
    } else {
      usleep(20000);
    }
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
  }
  fcntl(fds[0], F_SETFL, O_NONBLOCK);  // a grandchild may still hold the pipe: take what is there, no more
  while (true) {  // drain what is left
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    keep(buf, static_cast<size_t>(n), false);
  }
  keep(buf, 0, true);
  close(fds[0]);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (WIFEXITED(status)) res.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) res.signal = WTERMSIG(status);
  return res;
}

}  // namespace mla
