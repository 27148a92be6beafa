// File: common/logging.h
//
// Minimal leveled logging (our Abseil 20220623 has no absl/log):
//
//   SY_LOG(INFO) << "step " << step << " loss " << loss;
//   SY_LOG(WARNING) << "worker " << rank << " missed a heartbeat";
//   SY_LOG(ERROR) << status;
//
// Each statement writes one line to stderr (or to the sink installed with SetLogSink), glog style:
//
//   I1122 12:00:00.123 trainer.cc:42] step 10 loss 2.31
//
// (severity letter, local month/day, time with milliseconds, file base name and line). Lines are
// written whole under a mutex, so concurrent threads never interleave inside a line. Messages
// below the minimum level (SetMinLogLevel, default INFO) are not formatted: the stream arguments
// are not evaluated. ERROR only logs; library code never exits, so there is no FATAL.
#ifndef SWITCHYARD_COMMON_LOGGING_H_
#define SWITCHYARD_COMMON_LOGGING_H_

#include <functional>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace switchyard {

enum class LogSeverity : int { kInfo = 0, kWarning = 1, kError = 2 };

// "INFO", "WARNING", "ERROR".
const char* LogSeverityName(LogSeverity severity);

// Parses "info", "warning" or "error" (any case; "I", "W", "E" and "0", "1", "2" too), e.g. for a
// --min_log_level flag. Anything else is INVALID_ARGUMENT.
absl::StatusOr<LogSeverity> ParseLogSeverity(absl::string_view text);

// Messages below `severity` are dropped. Thread-safe; takes effect for statements that start after
// the call.
void SetMinLogLevel(LogSeverity severity);
LogSeverity MinLogLevel();

// Receives each formatted line (prefix included, ending in '\n'). The sink is called under the
// logging mutex, so it must not log itself. Pass nullptr to restore stderr. Meant for tests and for
// binaries that forward logs elsewhere.
using LogSink = std::function<void(LogSeverity severity, absl::string_view line)>;
void SetLogSink(LogSink sink);

namespace logging_internal {

inline bool ShouldLog(LogSeverity severity) {
  return static_cast<int>(severity) >= static_cast<int>(MinLogLevel());
}

// Collects one message and emits it from its destructor (the end of the full expression).
class LogMessage {
 public:
  LogMessage(const char* file, int line, LogSeverity severity);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;

  std::ostream& stream() { return stream_; }

 private:
  const char* file_;
  int line_;
  LogSeverity severity_;
  std::ostringstream stream_;
};

// Lets `cond ? (void)0 : Voidify() & stream` type-check: & binds looser than <<.
struct Voidify {
  void operator&(std::ostream&) {}
};

// Formats the prefix "I1122 12:00:00.123 file.cc:42] " for the current time (exposed for tests).
std::string FormatLogPrefix(LogSeverity severity, const char* file, int line);

}  // namespace logging_internal
}  // namespace switchyard

#define SY_LOG_SEVERITY_INFO ::switchyard::LogSeverity::kInfo
#define SY_LOG_SEVERITY_WARNING ::switchyard::LogSeverity::kWarning
#define SY_LOG_SEVERITY_ERROR ::switchyard::LogSeverity::kError

// SY_LOG(INFO|WARNING|ERROR) << ...;
#define SY_LOG(severity)                                                           \
  !::switchyard::logging_internal::ShouldLog(SY_LOG_SEVERITY_##severity)           \
      ? (void)0                                                                    \
      : ::switchyard::logging_internal::Voidify() &                                \
            ::switchyard::logging_internal::LogMessage(__FILE__, __LINE__,         \
                                                       SY_LOG_SEVERITY_##severity) \
                .stream()

#endif  // SWITCHYARD_COMMON_LOGGING_H_
