// A loaded model: the mapped file, its hyper-parameters, typed weight views and its tokenizer.
#pragma once
#include <memory>
#include <string>

#include "format/gguf.h"
#include "model/config.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvzap {

class Model {
 public:
  // Validates architecture, hyper-parameters and every tensor shape; throws kvzap::Error on any mismatch.
  static std::unique_ptr<Model> load(const std::string& path);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const gguf::File& file() const { return *file_; }
  // Bytes of weights read per decoded token (all matrices incl. the LM head): the bandwidth denominator.
  int64_t weight_bytes() const { return weight_bytes_; }

 private:
  std::unique_ptr<gguf::File> file_;
  ModelConfig config_;
  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  int64_t weight_bytes_ = 0;
};

}  // namespace kvzap
