// File: common/logging.cc
#include "common/logging.h"

#include <atomic>
#include <cstdio>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace switchyard {
namespace {

std::atomic<int> g_min_level{static_cast<int>(LogSeverity::kInfo)};

struct SinkState {
  absl::Mutex mu;
  LogSink sink ABSL_GUARDED_BY(mu);
};

SinkState& Sink() {
  static SinkState* state = new SinkState();  // never destroyed: logging works during exit
  return *state;
}

char SeverityLetter(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kInfo:
      return 'I';
    case LogSeverity::kWarning:
      return 'W';
    case LogSeverity::kError:
      return 'E';
  }
  return '?';
}

absl::string_view BaseName(const char* file) {
  absl::string_view path(file);
  size_t slash = path.find_last_of('/');
  return slash == absl::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

const char* LogSeverityName(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kInfo:
      return "INFO";
    case LogSeverity::kWarning:
      return "WARNING";
    case LogSeverity::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

absl::StatusOr<LogSeverity> ParseLogSeverity(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lower == "info" || lower == "i" || lower == "0") return LogSeverity::kInfo;
  if (lower == "warning" || lower == "warn" || lower == "w" || lower == "1") {
    return LogSeverity::kWarning;
  }
  if (lower == "error" || lower == "e" || lower == "2") return LogSeverity::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("log level \"", text, "\" is not one of \"info\", \"warning\", \"error\""));
}

void SetMinLogLevel(LogSeverity severity) {
  g_min_level.store(static_cast<int>(severity), std::memory_order_relaxed);
}

LogSeverity MinLogLevel() {
  return static_cast<LogSeverity>(g_min_level.load(std::memory_order_relaxed));
}

void SetLogSink(LogSink sink) {
  SinkState& state = Sink();
  absl::MutexLock lock(&state.mu);
  state.sink = std::move(sink);
}

namespace logging_internal {

std::string FormatLogPrefix(LogSeverity severity, const char* file, int line) {
  static const absl::TimeZone* const kLocal = new absl::TimeZone(absl::LocalTimeZone());
  return absl::StrCat(std::string(1, SeverityLetter(severity)),
                      absl::FormatTime("%m%d %H:%M:%E3S", absl::Now(), *kLocal), " ",
                      BaseName(file), ":", line, "] ");
}

LogMessage::LogMessage(const char* file, int line, LogSeverity severity)
    : file_(file), line_(line), severity_(severity) {}

LogMessage::~LogMessage() {
  std::string text = FormatLogPrefix(severity_, file_, line_);
  absl::StrAppend(&text, stream_.str());
  if (text.back() != '\n') text.push_back('\n');
  SinkState& state = Sink();
  absl::MutexLock lock(&state.mu);
  if (state.sink) {
    state.sink(severity_, text);
  } else {
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
  }
}

}  // namespace logging_internal
}  // namespace switchyard
