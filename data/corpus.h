// File: data/corpus.h
//
// The default training corpus that tools/prepare_corpus.sh (run by tools/setup.sh) builds from a
// Debian package, and the unigram entropy a model trained on it is compared against.
//
// Location: $SWITCHYARD_DATA_DIR/<name>/, where SWITCHYARD_DATA_DIR defaults to
// $HOME/.cache/switchyard/data (the passwd home directory when HOME is unset or empty). The
// default corpus is "kjv": the King James Bible, one document per chapter (1189 documents,
// about 1M tokens), tokenized with a byte-level BPE of 4096 ids (data/bpe_tokenizer.h), each
// document ending in <|endoftext|>. The directory holds
//   corpus.json                 the manifest (fields below; written by tools/prepare_corpus.sh)
//   <dataset_prefix>.bin/.idx   an MMIDIDX dataset (data/indexed_dataset.h)
//   <tokenizer>                 tokenizer.json
#ifndef SWITCHYARD_DATA_CORPUS_H_
#define SWITCHYARD_DATA_CORPUS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "data/indexed_dataset.h"

namespace switchyard {

// The environment variable naming the data directory, and the default corpus's name.
inline constexpr char kDataDirEnv[] = "SWITCHYARD_DATA_DIR";
inline constexpr char kDefaultCorpusName[] = "kjv";

// A corpus manifest, with its relative paths made absolute.
struct CorpusInfo {
  std::string name;             // manifest "name", e.g. "kjv"
  std::string dir;              // the directory holding corpus.json
  std::string dataset_prefix;   // dir + "/" + manifest "dataset_prefix": IndexedDataset::Open it
  std::string tokenizer_path;   // dir + "/" + manifest "tokenizer": BpeTokenizer::Load it
  std::string source_package;   // Debian package the text comes from, e.g. "bible-kjv-text"
  std::string package_version;  // its version, e.g. "4.38"
  int64_t documents = 0;        // documents in the dataset
  int64_t tokens = 0;           // tokens in the dataset, end-of-document ids included
  int64_t vocab_size = 0;       // tokenizer ids (every token id is below this)
  std::string bin_sha256;       // hex sha256 of <dataset_prefix>.bin
};

// $SWITCHYARD_DATA_DIR if set and non-empty, else <home>/.cache/switchyard/data.
std::string DataDir();
// DataDir() + "/kjv".
std::string DefaultCorpusDir();

// Reads and checks dir/corpus.json, and checks that the dataset's .bin and .idx and the
// tokenizer file exist (it does not open or hash them). kNotFound when the manifest or one of
// the files is missing (the message says to run tools/setup.sh); kInvalidArgument naming the
// file and field for a manifest that is not JSON, lacks a field, has a field of the wrong type
// or a negative count.
absl::StatusOr<CorpusInfo> LoadCorpusInfo(const std::string& dir);
// LoadCorpusInfo(DefaultCorpusDir()).
absl::StatusOr<CorpusInfo> FindDefaultCorpus();

// Entropy in nats/token of the empirical unigram distribution of `tokens`:
// H = -sum_t p_t ln p_t with p_t = count(t) / tokens.size(). The loss of a model that ignores
// context; a language model that learns anything beyond token frequencies goes below it.
// 0 for an empty or constant stream. Any int32 values are allowed.
double UnigramEntropyNats(absl::Span<const int32_t> tokens);
// The same over all tokens of all sequences of `dataset` (integer dtypes; values must fit
// int32). kFailedPrecondition for a float dtype, kOutOfRange for a token outside int32.
absl::StatusOr<double> DatasetUnigramEntropyNats(const IndexedDataset& dataset);

}  // namespace switchyard

#endif  // SWITCHYARD_DATA_CORPUS_H_
