// switchyard-worker: one process per GPU (or one CPU process) that executes a coordinator's plan.
//
// Modes (exactly one):
//   --self-check   print the version and the compute backend found (CUDA devices with their
//                  properties and library versions, or "CPU only" and why), exit 0.
// Later issues add --standalone and --coordinator. Without a mode the usage goes to stderr and the
// exit status is 2. Flags may be spelled with '-' or '_' (--self-check == --self_check).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "common/version.h"
#include "worker/self_check.h"

ABSL_FLAG(bool, self_check, false,
          "Print the version and the compute backend found (CUDA devices or CPU only), then exit.");

namespace {

constexpr char kUsage[] =
    "executes a Switchyard plan on one GPU (or CPU).\n"
    "usage:\n"
    "  switchyard-worker --self-check   print version and backend (CUDA devices or CPU only)\n"
    "  switchyard-worker --help         list the worker's flags\n"
    "  switchyard-worker --version      print the version";

// Abseil flag names are C++ identifiers; accept the conventional dashed spelling as well by
// rewriting "--self-check[=v]" to "--self_check[=v]" (only the name part, never the value).
std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> out(argv, argv + argc);
  for (size_t i = 1; i < out.size(); ++i) {
    std::string& a = out[i];
    if (a == "--") break;  // everything after "--" is positional
    if (a.size() < 3 || a[0] != '-' || a[1] != '-') continue;
    const size_t end = a.find('=');
    for (size_t j = 2; j < a.size() && j < end; ++j) {
      if (a[j] == '-') a[j] = '_';
    }
  }
  return out;
}

int SelfCheck() {
  std::printf("switchyard-worker %s (%s, %s)\n", switchyard::kVersion, switchyard::kBuildCompiler,
              switchyard::kBuildMode);
  absl::StatusOr<switchyard::worker::BackendInfo> info = switchyard::worker::QueryBackend();
  if (!info.ok()) {
    std::fprintf(stderr, "self-check failed: %s\n", info.status().ToString().c_str());
    return 1;
  }
  std::fputs(switchyard::worker::FormatBackend(*info).c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  absl::FlagsUsageConfig usage_config;
  // --help lists the flags defined under worker/ (Abseil's default matches only <program>.cc).
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "worker/");
  };
  usage_config.version_string = [] {
    return std::string("switchyard-worker ") + switchyard::kVersion + "\n";
  };
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<std::string> args = NormalizeFlagNames(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  if (positional.size() > 1) {
    std::fprintf(stderr, "switchyard-worker: unexpected argument '%s'\nswitchyard-worker: %s\n",
                 positional[1], kUsage);
    return 2;
  }
  if (absl::GetFlag(FLAGS_self_check)) return SelfCheck();
  std::fprintf(stderr, "switchyard-worker: %s\n", kUsage);
  return 2;
}
