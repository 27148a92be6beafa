// preprocess: tokenizes raw text or JSONL into a Megatron MMIDIDX dataset
// (data/indexed_dataset.h).
//
//   preprocess --input a.txt[,b.jsonl,...] --output-prefix out
//              (--tokenizer tokenizer.json | --train-vocab-size 4096 [--save-tokenizer tok.json])
//              [--json-key text] [--append-eod]
//
// Documents: a file ending in ".jsonl" or ".json" holds one JSON object per line and each
// non-blank line is a document (the string field --json-key, default "text"); any other file is
// one document, its bytes exactly as stored. Each document becomes one sequence and one document
// of the dataset, in input order; --append-eod appends the tokenizer's "<|endoftext|>" id.
// With --train-vocab-size the tokenizer is trained on all the documents first (they are held in
// memory, as the dataset writer holds its tokens). Token dtype: uint16 when the vocab has fewer
// than 65536 ids, else int32. Writes out.bin and out.idx; prints a summary to stderr. Flags take
// "--name value" or "--name=value". --help (-h) prints the usage on stdout and exits 0.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "data/bpe_tokenizer.h"
#include "data/indexed_dataset.h"
#include "nlohmann/json.hpp"

namespace switchyard::tools {
namespace {

constexpr char kUsage[] =
    "usage: preprocess --input a.txt[,b.jsonl] --output-prefix out\n"
    "                  (--tokenizer tokenizer.json | --train-vocab-size N [--save-tokenizer f])\n"
    "                  [--json-key text] [--append-eod]\n";

struct Options {
  std::vector<std::string> inputs;
  std::string output_prefix;
  std::string tokenizer;
  int64_t train_vocab_size = 0;
  std::string save_tokenizer;
  std::string json_key = "text";
  bool append_eod = false;
};

absl::StatusOr<Options> ParseArgs(int argc, char** argv) {
  std::map<std::string, std::string> values;
  Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", arg, "\""));
    }
    arg = arg.substr(2);
    if (arg == "append-eod") {
      opt.append_eod = true;
      continue;
    }
    std::string value;
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", arg, " needs a value"));
    }
    values[arg] = value;
  }
  for (const auto& [name, value] : values) {
    if (name == "input") {
      for (absl::string_view p : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        opt.inputs.emplace_back(p);
      }
    } else if (name == "output-prefix") {
      opt.output_prefix = value;
    } else if (name == "tokenizer") {
      opt.tokenizer = value;
    } else if (name == "train-vocab-size") {
      if (!absl::SimpleAtoi(value, &opt.train_vocab_size) || opt.train_vocab_size <= 0) {
        return absl::InvalidArgumentError("--train-vocab-size must be a positive integer");
      }
    } else if (name == "save-tokenizer") {
      opt.save_tokenizer = value;
    } else if (name == "json-key") {
      opt.json_key = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
  }
  if (opt.inputs.empty()) return absl::InvalidArgumentError("--input is required");
  if (opt.output_prefix.empty()) return absl::InvalidArgumentError("--output-prefix is required");
  if (opt.tokenizer.empty() == (opt.train_vocab_size == 0)) {
    return absl::InvalidArgumentError("give exactly one of --tokenizer and --train-vocab-size");
  }
  if (!opt.save_tokenizer.empty() && opt.train_vocab_size == 0) {
    return absl::InvalidArgumentError("--save-tokenizer needs --train-vocab-size");
  }
  return opt;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open input ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat("error reading ", path));
  return ss.str();
}

bool IsJsonl(const std::string& path) {
  return absl::EndsWith(path, ".jsonl") || absl::EndsWith(path, ".json");
}

absl::Status AppendDocuments(const std::string& path, const std::string& json_key,
                             std::vector<std::string>* docs) {
  SY_ASSIGN_OR_RETURN(std::string content, ReadFile(path));
  if (!IsJsonl(path)) {
    docs->push_back(std::move(content));
    return absl::OkStatus();
  }
  int64_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(content, '\n')) {
    ++line_no;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    nlohmann::json obj;
    try {
      obj = nlohmann::json::parse(line.begin(), line.end());
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": not valid JSON: ", e.what()));
    }
    if (!obj.is_object() || !obj.contains(json_key) || !obj[json_key].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": no string field \"",
                                                     json_key, "\" (see --json-key)"));
    }
    docs->push_back(obj[json_key].get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status Run(const Options& opt) {
  std::vector<std::string> docs;
  for (const std::string& path : opt.inputs) {
    SY_RETURN_IF_ERROR(AppendDocuments(path, opt.json_key, &docs));
  }
  absl::StatusOr<BpeTokenizer> made = opt.tokenizer.empty()
                                          ? BpeTokenizer::Train(docs, opt.train_vocab_size)
                                          : BpeTokenizer::Load(opt.tokenizer);
  if (!made.ok()) return Annotate(made.status(), "tokenizer");
  const BpeTokenizer& tok = *made;
  if (!opt.save_tokenizer.empty()) SY_RETURN_IF_ERROR(tok.Save(opt.save_tokenizer));
  if (opt.append_eod && !tok.eod_id().has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--append-eod: the tokenizer has no \"", kEndOfTextToken, "\" token"));
  }
  const IndexedDType dtype =
      tok.vocab_size() < 65536 ? IndexedDType::kUInt16 : IndexedDType::kInt32;
  IndexedDatasetWriter writer(dtype);
  int64_t total_tokens = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(docs[d]);
    if (!ids.ok()) return Annotate(ids.status(), absl::StrCat("document ", d));
    std::vector<int64_t> tokens(ids->begin(), ids->end());
    if (opt.append_eod) tokens.push_back(*tok.eod_id());
    SY_RETURN_IF_ERROR(Annotate(writer.Add(tokens), absl::StrCat("document ", d)));
    writer.EndDocument();
    total_tokens += static_cast<int64_t>(tokens.size());
  }
  SY_RETURN_IF_ERROR(writer.Finalize(opt.output_prefix));
  std::fprintf(stderr,
               "preprocess: %zu documents, %lld tokens, vocab %lld (%lld merges), dtype %s -> "
               "%s.{bin,idx}\n",
               docs.size(), static_cast<long long>(total_tokens),
               static_cast<long long>(tok.vocab_size()), static_cast<long long>(tok.num_merges()),
               IndexedDTypeName(dtype), opt.output_prefix.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace switchyard::tools

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "--helpfull") {
      std::fputs(switchyard::tools::kUsage, stdout);  // asked for: not an error
      return 0;
    }
  }
  absl::StatusOr<switchyard::tools::Options> opt = switchyard::tools::ParseArgs(argc, argv);
  if (!opt.ok()) {
    std::fprintf(stderr, "preprocess: %s\n%s", opt.status().ToString().c_str(),
                 switchyard::tools::kUsage);
    return 2;
  }
  const absl::Status s = switchyard::tools::Run(*opt);
  if (!s.ok()) {
    std::fprintf(stderr, "preprocess: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
