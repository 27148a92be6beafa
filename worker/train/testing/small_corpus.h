// File: worker/train/testing/small_corpus.h
//
// Test helper: the default corpus (tools/prepare_corpus.sh) re-tokenized with a small byte-level
// BPE vocabulary, so that CPU-sized models see enough of the real text in a few hundred steps (the
// corpus's own 4096-token vocabulary makes the LM head dominate a CPU step).
#ifndef SWITCHYARD_WORKER_TRAIN_TESTING_SMALL_CORPUS_H_
#define SWITCHYARD_WORKER_TRAIN_TESTING_SMALL_CORPUS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace switchyard::train::testing {

struct SmallCorpus {
  std::string name;            // the source corpus, e.g. "kjv"
  std::string prefix;          // indexed dataset prefix (uint16 tokens, one document per sequence)
  int64_t vocab_size = 0;      // tokens of the small tokenizer
  int64_t tokens = 0;          // tokens in the dataset, end-of-document ids included
  double unigram_entropy = 0;  // nats/token of the dataset's token frequencies
};

// Decodes the default corpus, trains a `vocab_size` BPE on it, and writes the re-tokenized
// dataset to `dir`/small_text_document.{bin,idx}. Deterministic.
absl::StatusOr<SmallCorpus> MakeSmallCorpus(const std::string& dir, int64_t vocab_size);

}  // namespace switchyard::train::testing

#endif  // SWITCHYARD_WORKER_TRAIN_TESTING_SMALL_CORPUS_H_
