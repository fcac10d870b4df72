// "random" (docs/ALGORITHMS.md §8.1, kvpress RandomPress): uniform scores in [0, 1). Each score is a hash of
// (seed, layer, head, position), so it does not depend on how the tokens were split into steps.
#include "common/rng.h"
#include "press/press.h"

namespace kvzap {
namespace {

class RandomScorer : public Scorer {
 public:
  explicit RandomScorer(uint64_t seed) : seed_(seed) {}
  bool per_step() const override { return true; }
  void score_step(const LayerStep& step, const KvCache& cache, float* out) override {
    const int H = cache.n_head_kv();
    for (int h = 0; h < H; h++) {
      const uint64_t stream = hash_combine(hash_combine(seed_, (uint64_t)step.layer), (uint64_t)h);
      for (int64_t t = 0; t < step.n_tok; t++) {
        const uint64_t bits = hash_combine(stream, (uint64_t)(uint32_t)step.pos[t]);
        out[(size_t)h * step.n_tok + t] = (float)(bits >> 40) * (1.0f / 16777216.0f);  // 24 bits -> [0, 1)
      }
    }
  }

 private:
  uint64_t seed_;
};

RegisterScorer reg({"random", "uniform random scores, seeded by --seed (a baseline)", true,
                    [](const PressSpec& opt, const Model&) { return std::make_unique<RandomScorer>(opt.seed); },
                    {.kvpress_parity = "cannot match: different random generators (same counts)"}});

}  // namespace
}  // namespace kvzap
