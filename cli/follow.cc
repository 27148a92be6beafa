#include "cli/follow.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "absl/strings/str_format.h"

namespace switchyard::cli {
namespace {

std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

}  // namespace

int FollowJob(Client& client, Output output, const std::string& verb, const std::string& name,
              int64_t train_iters) {
  const bool bar = isatty(STDERR_FILENO) && output == Output::kTable;
  const bool step_lines = !(bar && isatty(STDOUT_FILENO));
  auto context = client.Context(/*seconds=*/0);
  v1::WatchJobRequest request;
  request.set_name(name);
  auto reader = client.jobs().WatchJob(context.get(), request);
  v1::WatchJobResponse update;
  v1::Job::State last_state = v1::Job::STATE_UNSPECIFIED;
  std::string last_message;
  std::optional<std::pair<int64_t, std::chrono::steady_clock::time_point>> first_step;
  bool bar_shown = false;
  std::chrono::steady_clock::time_point last_draw;
  auto clear_bar = [&]() {
    if (bar_shown) std::fprintf(stderr, "\r\033[K");
    bar_shown = false;
  };
  while (reader->Read(&update)) {
    if (update.has_event()) {
      last_state = update.event().state();
      last_message = update.event().message();
    }
    if (output == Output::kJson || output == Output::kYaml) {
      if (output == Output::kJson) {
        std::printf("%s\n", TerminalSafeLines(ToJson(update, /*pretty=*/false)).c_str());
      } else {
        std::printf("---\n%s", TerminalSafeLines(JsonToYaml(ToJson(update, false))).c_str());
      }
      std::fflush(stdout);
      continue;
    }
    if (output == Output::kName) continue;
    if (update.has_event()) {
      clear_bar();
      std::printf("%s\n", EventLine(update.event()).c_str());
      std::fflush(stdout);
      continue;
    }
    const v1::StepMetrics& step = update.step();
    if (step_lines) {
      std::printf("%s\n", StepLine(step).c_str());
      std::fflush(stdout);
    }
    if (!bar) continue;
    // Redraw at most every 100 ms, and always at the last step.
    const auto now = std::chrono::steady_clock::now();
    if (!first_step) first_step.emplace(step.step(), now);
    if (bar_shown && now - last_draw < std::chrono::milliseconds(100) &&
        step.step() < train_iters) {
      continue;
    }
    last_draw = now;
    std::string eta = "?";
    const double elapsed = std::chrono::duration<double>(now - first_step->second).count();
    const int64_t done = step.step() - first_step->first;
    if (done > 0 && train_iters > 0) {
      eta = Duration(elapsed / done * std::max<int64_t>(0, train_iters - step.step()));
    }
    const int width = 30;
    const double frac =
        train_iters > 0 ? std::min(1.0, static_cast<double>(step.step()) / train_iters) : 0.0;
    const int filled = static_cast<int>(frac * width);
    std::fprintf(stderr, "\r\033[K[%s%s] %lld/%lld %3d%% loss %.4f ETA %s",
                 std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                 static_cast<long long>(step.step()), static_cast<long long>(train_iters),
                 static_cast<int>(frac * 100.0), step.loss(), eta.c_str());
    bar_shown = true;
  }
  clear_bar();
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return client.Fail(verb, status);
  const std::string state = v1::Job::State_Name(last_state);
  if (last_state == v1::Job::SUCCEEDED) {
    std::fprintf(stderr, "syctl %s: %s SUCCEEDED\n", verb.c_str(), name.c_str());
    return kExitOk;
  }
  std::fprintf(stderr, "syctl %s: %s ended %s%s%s\n", verb.c_str(), name.c_str(), state.c_str(),
               last_message.empty() ? "" : ": ", TerminalSafe(last_message).c_str());
  return kExitFailure;
}

}  // namespace switchyard::cli
