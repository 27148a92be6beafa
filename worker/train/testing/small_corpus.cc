#include "worker/train/testing/small_corpus.h"

#include <filesystem>
#include <vector>

#include "common/status.h"
#include "data/bpe_tokenizer.h"
#include "data/corpus.h"
#include "data/indexed_dataset.h"

namespace switchyard::train::testing {

absl::StatusOr<SmallCorpus> MakeSmallCorpus(const std::string& dir, int64_t vocab_size) {
  SY_ASSIGN_OR_RETURN(CorpusInfo corpus, FindDefaultCorpus());
  SY_ASSIGN_OR_RETURN(IndexedDataset dataset, IndexedDataset::Open(corpus.dataset_prefix));
  SY_ASSIGN_OR_RETURN(BpeTokenizer tokenizer, BpeTokenizer::Load(corpus.tokenizer_path));
  std::vector<std::string> texts;
  for (int64_t i = 0; i < dataset.num_sequences(); ++i) {
    std::vector<int32_t> ids(dataset.SequenceLength(i));
    SY_RETURN_IF_ERROR(dataset.ReadTokens(i, 0, absl::MakeSpan(ids)));
    if (!ids.empty() && tokenizer.eod_id() && ids.back() == *tokenizer.eod_id()) ids.pop_back();
    SY_ASSIGN_OR_RETURN(std::string text, tokenizer.Decode(ids));
    texts.push_back(std::move(text));
  }
  SY_ASSIGN_OR_RETURN(BpeTokenizer small, BpeTokenizer::Train(texts, vocab_size));
  IndexedDatasetWriter writer(IndexedDType::kUInt16);
  std::vector<int32_t> all;
  for (const std::string& text : texts) {
    SY_ASSIGN_OR_RETURN(std::vector<int32_t> ids, small.Encode(text));
    ids.push_back(*small.eod_id());
    SY_RETURN_IF_ERROR(writer.Add(std::vector<int64_t>(ids.begin(), ids.end())));
    writer.EndDocument();
    all.insert(all.end(), ids.begin(), ids.end());
  }
  std::filesystem::create_directories(dir);
  SmallCorpus out;
  out.name = corpus.name;
  out.prefix = dir + "/small_text_document";
  SY_RETURN_IF_ERROR(writer.Finalize(out.prefix));
  out.vocab_size = small.vocab_size();
  out.tokens = static_cast<int64_t>(all.size());
  out.unigram_entropy = UnigramEntropyNats(all);
  return out;
}

}  // namespace switchyard::train::testing
