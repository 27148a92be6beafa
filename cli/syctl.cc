// syctl: the Switchyard command-line client.
//
//   syctl [-o text|json] <verb> [args...]
//
// Data goes to stdout, messages to stderr. Exit status: 0 success, 2 usage error (unknown verb or
// flag, or a verb this build does not implement yet), 1 any other failure. Only `version` and
// `help` exist in this build; the others are reserved (plan, submit, get, list, cancel, watch,
// workers, quickstart) and answer "not available yet".
#include <cstdio>
#include <string>
#include <vector>

#include "common/version.h"
#include "nlohmann/json.hpp"

namespace {

struct Verb {
  const char* name;
  const char* summary;
};

constexpr Verb kVerbs[] = {
    {"plan", "plan a job spec: parallel mapping, memory and step-time estimate"},
    {"submit", "submit a job spec to the coordinator"},
    {"get", "show one job"},
    {"list", "list jobs"},
    {"cancel", "cancel a job"},
    {"watch", "follow a job's events and step reports"},
    {"workers", "list the workers attached to the coordinator"},
    {"quickstart", "run a small MoE job end to end"},
    {"version", "print the syctl version"},
    {"help", "print this help"},
};

enum class Output { kText, kJson };

void PrintUsage(FILE* f) {
  std::fprintf(f,
               "syctl: command-line client for Switchyard.\n"
               "usage: syctl [-o text|json] <verb> [args...]\n"
               "verbs:\n");
  for (const Verb& v : kVerbs) std::fprintf(f, "  %-11s %s\n", v.name, v.summary);
  std::fprintf(f,
               "flags:\n"
               "  -o, --output text|json   output format (default text)\n");
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "syctl: %s\n", message.c_str());
  PrintUsage(stderr);
  return 2;
}

int Version(Output output) {
  if (output == Output::kJson) {
    nlohmann::json j = {{"version", switchyard::kVersion}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("syctl %s\n", switchyard::kVersion);
  }
  return 0;
}

// Parses "-o json", "-o=json", "--output json", "--output=json". Returns false on a bad value.
bool ParseOutput(const std::string& value, Output* out) {
  if (value == "text") {
    *out = Output::kText;
    return true;
  }
  if (value == "json") {
    *out = Output::kJson;
    return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  // -o/--output may appear anywhere (kubectl style); other flags before the verb are errors and
  // flags after it belong to the verb.
  Output output = Output::kText;
  std::vector<std::string> args;  // the verb and its arguments
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-o" || a == "--output") {
      if (i + 1 >= argc) return Usage(a + " needs a value (text or json)");
      if (!ParseOutput(argv[++i], &output)) {
        return Usage("unknown output format '" + std::string(argv[i]) + "' (want text or json)");
      }
    } else if (a.rfind("-o=", 0) == 0 || a.rfind("--output=", 0) == 0) {
      const std::string value = a.substr(a.find('=') + 1);
      if (!ParseOutput(value, &output)) {
        return Usage("unknown output format '" + value + "' (want text or json)");
      }
    } else if (args.empty() && (a == "-h" || a == "--help")) {
      args.push_back("help");
    } else if (args.empty() && !a.empty() && a[0] == '-') {
      return Usage("unknown flag '" + a + "'");
    } else {
      args.push_back(a);
    }
  }

  if (args.empty()) return Usage("missing verb");
  const std::string& verb = args[0];
  if (verb == "help") {
    PrintUsage(stdout);
    return 0;
  }
  if (verb == "version") {
    if (args.size() > 1) return Usage("version takes no arguments");
    return Version(output);
  }
  for (const Verb& v : kVerbs) {
    if (verb == v.name) {
      std::fprintf(stderr, "syctl %s: not available yet in this build\n", v.name);
      return 2;
    }
  }
  return Usage("unknown verb '" + verb + "'");
}
