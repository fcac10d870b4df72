// A loaded model: the mapped file, its hyper-parameters, typed weight views and its tokenizer.
#pragma once
#include <memory>
#include <string>

#include "format/gguf.h"
#include "format/hf_checkpoint.h"
#include "model/config.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvzap {

struct LoadOptions {
  // Hugging Face checkpoints only: quantise every weight matrix at load (Q8_0 or Q4_K); F32 keeps the
  // file's F32/F16/BF16 matrices as they are (zero-copy from the mapping).
  GgmlType quantize = GgmlType::F32;
};

class Model {
 public:
  // A GGUF file, or a Hugging Face checkpoint folder (config.json + safetensors + tokenizer.json;
  // model_hf.cpp). Validates architecture, hyper-parameters and every tensor shape; throws kvzap::Error
  // on any mismatch.
  static std::unique_ptr<Model> load(const std::string& path, const LoadOptions& opt = {});

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // The GGUF file, or the checkpoint's first shard, and the bytes of all weight files (fingerprints).
  const std::string& weights_path() const { return weights_path_; }
  uint64_t weights_file_bytes() const { return weights_file_bytes_; }
  bool is_hf() const { return hf_ != nullptr; }
  // Bytes of weights read per decoded token (all matrices incl. the LM head): the bandwidth denominator.
  int64_t weight_bytes() const { return weight_bytes_; }

 private:
  static std::unique_ptr<Model> load_hf(const std::string& dir, const LoadOptions& opt);

  std::unique_ptr<gguf::File> file_;          // GGUF models
  std::unique_ptr<hf::Checkpoint> hf_;        // Hugging Face checkpoints
  std::string weights_path_;
  uint64_t weights_file_bytes_ = 0;
  ModelConfig config_;
  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  int64_t weight_bytes_ = 0;
};

}  // namespace kvzap
