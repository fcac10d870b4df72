// kvzap._kvzap: the Python binding, a thin layer over the C API (include/kvzap/kvzap.h). Every C status
// other than KVZAP_OK raises kvzap.Error with the engine's message. The GIL is released around every call
// that runs the model (prefill, feed, decode, the pipeline), so threads with their own engines run at once.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kvzap/kvzap.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

struct KvzapError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(kvzap_status st) {
  if (st != KVZAP_OK) throw KvzapError(kvzap_last_error());
}

// One engine runs one call at a time (the C API's rule): every call that touches an engine or one of its
// sequences releases the GIL first, then takes the engine's mutex, so threads sharing a pipeline queue up
// instead of racing, and a streaming callback (which takes the GIL back) cannot deadlock with them.
template <class F>
auto locked(std::mutex& mu, F&& f) {
  nb::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(mu);
  return f();
}

std::string take_string(char* s) {
  std::string out = s ? s : "";
  kvzap_free(s);
  return out;
}

std::vector<int32_t> take_ids(int32_t* ids, size_t n) {
  std::vector<int32_t> out(ids, ids + n);
  kvzap_free(ids);
  return out;
}

struct Model {
  kvzap_model* h = nullptr;
  Model(const std::string& path, const std::string& options) {
    kvzap_status st;
    {
      nb::gil_scoped_release nogil;
      st = kvzap_model_load(path.c_str(), options.c_str(), &h);
    }
    check(st);
  }
  ~Model() { kvzap_model_free(h); }
  std::string info() const {
    char* s = nullptr;
    check(kvzap_model_info(h, &s));
    return take_string(s);
  }
  std::vector<int32_t> tokenize(const std::string& text, bool add_bos, bool parse_special) const {
    int32_t* ids = nullptr;
    size_t n = 0;
    check(kvzap_tokenize(h, text.data(), text.size(), add_bos, parse_special, &ids, &n));
    return take_ids(ids, n);
  }
  nb::bytes detokenize(const std::vector<int32_t>& ids, bool skip_special) const {
    char* s = nullptr;
    size_t len = 0;
    check(kvzap_detokenize(h, ids.data(), ids.size(), skip_special, &s, &len));
    nb::bytes out(s, len);
    kvzap_free(s);
    return out;
  }
  std::string apply_chat_template(const std::string& messages, bool add_generation_prompt) const {
    char* s = nullptr;
    check(kvzap_apply_chat_template(h, messages.c_str(), add_generation_prompt, &s));
    return take_string(s);
  }
  std::vector<int32_t> chat_tokens(const std::string& messages, bool add_generation_prompt) const {
    int32_t* ids = nullptr;
    size_t n = 0;
    check(kvzap_chat_tokens(h, messages.c_str(), add_generation_prompt, &ids, &n));
    return take_ids(ids, n);
  }
};

struct Press {
  kvzap_press* h = nullptr;  // null: no press ({"press": "none"})
  Press(Model& m, const std::string& spec) { check(kvzap_press_create(m.h, spec.c_str(), &h)); }
  ~Press() { kvzap_press_free(h); }
  std::string spec() const {
    char* s = nullptr;
    check(kvzap_press_spec(h, &s));
    return take_string(s);
  }
};

// A Python callable invoked from the engine's thread with the GIL re-acquired; a Python exception stops
// the run and is re-raised once the C call has returned.
struct Callback {
  nb::object fn;
  std::optional<nb::python_error> error;
  static int call(void* user, size_t qi, const char* piece, size_t len) {
    auto* self = static_cast<Callback*>(user);
    nb::gil_scoped_acquire gil;
    try {
      nb::object r = self->fn(qi, nb::str(piece, len));
      return r.is_none() || nb::cast<bool>(r) ? 1 : 0;
    } catch (nb::python_error& e) {
      self->error.emplace(e);
      return 0;
    }
  }
};

struct Engine {
  kvzap_engine* h = nullptr;
  std::shared_ptr<std::mutex> mu = std::make_shared<std::mutex>();
  Engine(Model& m, const std::string& options) { check(kvzap_engine_create(m.h, options.c_str(), &h)); }
  ~Engine() { kvzap_engine_free(h); }
  std::string info() const {
    char* s = nullptr;
    check(locked(*mu, [&] { return kvzap_engine_info(h, &s); }));
    return take_string(s);
  }
  std::string pipeline_run(const std::string& request, Press* press, nb::object on_text) {
    Callback cb{on_text};
    char* result = nullptr;
    kvzap_status st;
    {
      nb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(*mu);
      st = kvzap_pipeline_run(h, request.c_str(), press ? press->h : nullptr, on_text.is_none() ? nullptr : &Callback::call,
                              &cb, &result);
    }
    if (cb.error) {
      kvzap_free(result);
      throw std::move(*cb.error);
    }
    check(st);
    return take_string(result);
  }
  std::string eval_ruler(Press* press, const std::string& options) {
    char* result = nullptr;
    kvzap_status st;
    {
      nb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(*mu);
      st = kvzap_eval_ruler(h, press ? press->h : nullptr, options.c_str(), &result);
    }
    check(st);
    return take_string(result);
  }
};

// A recorded context prefill (kvzap_record_context); tensors come out as numpy views into it.
struct Recording {
  kvzap_recording* h = nullptr;
  ~Recording() { kvzap_recording_free(h); }
  size_t steps() const {
    size_t n = 0;
    check(kvzap_recording_steps(h, &n));
    return n;
  }
};

// KVzip+ targets of one text (kvzap_kvzip_targets); arrays come out as numpy views into it.
struct Targets {
  kvzap_targets* h = nullptr;
  ~Targets() { kvzap_targets_free(h); }
  kvzap_targets_view view() const {
    kvzap_targets_view v{};
    check(kvzap_targets_get(h, &v));
    return v;
  }
};

struct Sequence {
  kvzap_sequence* h = nullptr;
  bool owned = true;
  std::shared_ptr<std::mutex> mu;
  Sequence(kvzap_sequence* s, bool own, std::shared_ptr<std::mutex> m) : h(s), owned(own), mu(std::move(m)) {}
  ~Sequence() {
    if (owned) locked(*mu, [&] { kvzap_sequence_free(h); });
  }
  void prefill(const std::vector<int32_t>& ids, Press* press, const std::string& question) {
    kvzap_status st;
    {
      nb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(*mu);
      st = kvzap_sequence_prefill(h, ids.data(), ids.size(), press ? press->h : nullptr, question.c_str());
    }
    check(st);
  }
  void feed(const std::vector<int32_t>& ids) {
    kvzap_status st;
    {
      nb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(*mu);
      st = kvzap_sequence_feed(h, ids.data(), ids.size());
    }
    check(st);
  }
  void start_generation(const std::string& options) {
    check(locked(*mu, [&] { return kvzap_sequence_start_generation(h, options.c_str()); }));
  }
  std::tuple<int32_t, bool, nb::bytes, std::string> decode_step() {
    kvzap_token_event ev{};
    kvzap_status st;
    {
      nb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(*mu);
      st = kvzap_sequence_decode_step(h, &ev);
    }
    check(st);
    return {ev.token, ev.finished != 0, nb::bytes(ev.text, ev.text_len), ev.finish_reason};
  }
  void rewind(int64_t pos) { check(locked(*mu, [&] { return kvzap_sequence_rewind(h, pos); })); }
  void save(const std::string& path) const { check(locked(*mu, [&] { return kvzap_sequence_save(h, path.c_str()); })); }
  void load(const std::string& path) {
    kvzap_status st;
    {
      nb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(*mu);
      st = kvzap_sequence_load(h, path.c_str());
    }
    check(st);
  }
  // [n_layer, n_head_kv, n_past] booleans (a copy: the cache holds positions in 16-entry pages).
  nb::ndarray<nb::numpy, bool, nb::ndim<3>> kept_mask() const {
    kvzap_kv_stats s{};
    check(locked(*mu, [&] { return kvzap_sequence_kv_stats(h, &s, nullptr, 0); }));
    const size_t n = (size_t)s.n_layer * (size_t)s.n_head_kv * (size_t)s.n_past;
    auto* m = new uint8_t[n ? n : 1];
    nb::capsule owner(m, [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
    check(locked(*mu, [&] { return kvzap_sequence_kept_mask(h, m, n); }));
    return nb::ndarray<nb::numpy, bool, nb::ndim<3>>(reinterpret_cast<bool*>(m),
                                                     {(size_t)s.n_layer, (size_t)s.n_head_kv, (size_t)s.n_past}, owner);
  }
  nb::dict kv_stats() const {
    kvzap_kv_stats s{};
    check(locked(*mu, [&] { return kvzap_sequence_kv_stats(h, &s, nullptr, 0); }));
    const size_t n = (size_t)s.n_layer * (size_t)s.n_head_kv;
    auto* kept = new int64_t[n ? n : 1];
    nb::capsule owner(kept, [](void* p) noexcept { delete[] static_cast<int64_t*>(p); });
    check(locked(*mu, [&] { return kvzap_sequence_kv_stats(h, &s, kept, n); }));
    nb::dict d;
    d["n_past"] = s.n_past;
    d["kv_bytes"] = s.bytes_resident;
    d["kv_bytes_full"] = s.bytes_full;
    d["evicted_fraction"] = s.evicted_fraction;
    d["window_dropped"] = s.window_dropped;
    d["kept"] = nb::ndarray<nb::numpy, int64_t, nb::ndim<2>>(kept, {(size_t)s.n_layer, (size_t)s.n_head_kv}, owner);
    return d;
  }
};

}  // namespace

NB_MODULE(_kvzap, m) {
  m.doc() = "kvzap engine binding (C API); use the kvzap package";
  nb::exception<KvzapError>(m, "Error", PyExc_RuntimeError);

  m.def("version", [] { return std::string(kvzap_version()); });
  m.def("presses", [] {
    char* s = nullptr;
    check(kvzap_presses(&s));
    return take_string(s);
  });
  m.def("press_spec_normalize", [](const std::string& spec) {
    char* s = nullptr;
    check(kvzap_press_spec_normalize(spec.c_str(), &s));
    return take_string(s);
  });
  m.def("resolve_model", [](const std::string& name) {
    char* s = nullptr;
    check(kvzap_resolve_model(name.c_str(), &s));
    return take_string(s);
  });
  m.def("set_data_dir", [](const std::string& dir) { kvzap_set_data_dir(dir.c_str()); });
  m.def("data_dir", [] {
    char* s = nullptr;
    check(kvzap_get_data_dir(&s));
    return take_string(s);
  });

  m.def(
      "train_linear_surrogate",
      [](nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu> x,
         nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu> y, double alpha, const std::string& out_dir) {
        if (x.shape(0) != y.shape(0) || x.shape(1) != y.shape(1))
          throw KvzapError("train_linear_surrogate: x is [n, layer, n_embd] and y [n, layer, n_head_kv]: got x " +
                           std::to_string(x.shape(0)) + "x" + std::to_string(x.shape(1)) + " and y " +
                           std::to_string(y.shape(0)) + "x" + std::to_string(y.shape(1)));
        kvzap_status st;
        {
          nb::gil_scoped_release nogil;
          st = kvzap_train_linear_surrogate(x.data(), y.data(), (int64_t)x.shape(0), (int32_t)x.shape(1),
                                            (int32_t)x.shape(2), (int32_t)y.shape(2), alpha, out_dir.c_str());
        }
        check(st);
      },
      "x"_a, "y"_a, "alpha"_a, "out_dir"_a);

  m.def(
      "train_mlp_surrogate",
      [](nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu> x,
         nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu> y, const std::string& options,
         const std::string& out_dir) {
        if (x.shape(0) != y.shape(0) || x.shape(1) != y.shape(1))
          throw KvzapError("train_mlp_surrogate: x is [n, layer, n_embd] and y [n, layer, n_head_kv]");
        kvzap_status st;
        {
          nb::gil_scoped_release nogil;
          st = kvzap_train_mlp_surrogate(x.data(), y.data(), (int64_t)x.shape(0), (int32_t)x.shape(1),
                                         (int32_t)x.shape(2), (int32_t)y.shape(2), options.c_str(), out_dir.c_str());
        }
        check(st);
      },
      "x"_a, "y"_a, "options"_a, "out_dir"_a);

  nb::class_<Model>(m, "Model")
      .def(nb::init<const std::string&, const std::string&>(), "path"_a, "options"_a = "")
      .def("info", &Model::info)
      .def("tokenize", &Model::tokenize, "text"_a, "add_bos"_a = true, "parse_special"_a = true)
      .def("detokenize", &Model::detokenize, "ids"_a, "skip_special"_a = false)
      .def("apply_chat_template", &Model::apply_chat_template, "messages"_a, "add_generation_prompt"_a = true)
      .def("chat_tokens", &Model::chat_tokens, "messages"_a, "add_generation_prompt"_a = true);

  m.def(
      "kvzap_scores",
      [](Model& model, const std::string& spec, Recording& rec, int layer, size_t step) {
        kvzap_recording* r = rec.h;
        const float* p = nullptr;
        int64_t n_tok = 0, heads = 0, width = 0;
        check(kvzap_recording_tensor(r, step, layer, "k", &p, &n_tok, &heads, &width));
        const size_t n = (size_t)n_tok * (size_t)heads;
        auto* out = new float[n ? n : 1];
        nb::capsule owner(out, [](void* q) noexcept { delete[] static_cast<float*>(q); });
        kvzap_status st;
        {
          nb::gil_scoped_release nogil;
          st = kvzap_kvzap_scores(model.h, spec.c_str(), r, step, layer, out, n);
        }
        check(st);
        return nb::ndarray<nb::numpy, float, nb::ndim<2>>(out, {(size_t)n_tok, (size_t)heads}, owner);
      },
      "model"_a, "spec"_a, "recording"_a, "layer"_a, "step"_a = 0);

  nb::class_<Press>(m, "Press")
      .def(nb::init<Model&, const std::string&>(), "model"_a, "spec"_a, nb::keep_alive<1, 2>())
      .def("spec", &Press::spec)
      .def_prop_ro("is_none", [](const Press& p) { return p.h == nullptr; });

  nb::class_<Engine>(m, "Engine")
      .def(nb::init<Model&, const std::string&>(), "model"_a, "options"_a = "", nb::keep_alive<1, 2>())
      .def("info", &Engine::info)
      .def("pipeline_run", &Engine::pipeline_run, "request"_a, "press"_a.none(), "on_text"_a.none())
      .def("eval_ruler", &Engine::eval_ruler, "press"_a.none(), "options"_a)
      .def("record_context",
           [](Engine& e, const std::vector<int32_t>& ids) {
             kvzap_recording* r = nullptr;
             kvzap_status st;
             {
               nb::gil_scoped_release nogil;
               std::lock_guard<std::mutex> lock(*e.mu);
               st = kvzap_record_context(e.h, ids.data(), ids.size(), &r);
             }
             check(st);
             auto* rec = new Recording();
             rec->h = r;
             return rec;
           },
           "ids"_a)
      .def("kvzip_targets",
           [](Engine& e, const std::string& text, size_t n_sample, uint64_t seed) {
             kvzap_targets* t = nullptr;
             kvzap_status st;
             {
               nb::gil_scoped_release nogil;
               std::lock_guard<std::mutex> lock(*e.mu);
               st = kvzap_kvzip_targets(e.h, text.data(), text.size(), n_sample, seed, &t);
             }
             check(st);
             auto* out = new Targets();
             out->h = t;
             return out;
           },
           "text"_a, "n_sample"_a, "seed"_a)
      .def("new_sequence",
           [](Engine& e) {
             kvzap_sequence* s = nullptr;
             check(locked(*e.mu, [&] { return kvzap_sequence_create(e.h, &s); }));
             return new Sequence(s, true, e.mu);
           },
           nb::keep_alive<0, 1>())
      .def("sequence",
           [](Engine& e) {
             kvzap_sequence* s = nullptr;
             check(kvzap_engine_sequence(e.h, &s));
             return new Sequence(s, false, e.mu);
           },
           nb::keep_alive<0, 1>());

  nb::class_<Recording>(m, "Recording")
      .def_prop_ro("n_steps", &Recording::steps)
      .def(
          "tensor",
          [](nb::handle self, const std::string& which, int layer, size_t step) {
            const Recording& r = nb::cast<const Recording&>(self);
            const float* p = nullptr;
            int64_t n_tok = 0, heads = 0, width = 0;
            check(kvzap_recording_tensor(r.h, step, layer, which.c_str(), &p, &n_tok, &heads, &width));
            // A read-only view into the recording (no copy); the array keeps the recording alive.
            if (which == "h") return nb::ndarray<nb::numpy, const float>(p, {(size_t)n_tok, (size_t)width}, self);
            return nb::ndarray<nb::numpy, const float>(p, {(size_t)n_tok, (size_t)heads, (size_t)width}, self);
          },
          "which"_a, "layer"_a, "step"_a = 0);

  // Read-only views into the targets (no copies); each array keeps the Targets object alive.
  nb::class_<Targets>(m, "Targets")
      .def_prop_ro("log_scores",
                   [](nb::handle self) {
                     const kvzap_targets_view v = nb::cast<const Targets&>(self).view();
                     return nb::ndarray<nb::numpy, const float, nb::ndim<3>>(
                         v.log_scores, {(size_t)v.n_layer, (size_t)v.n_head_kv, (size_t)v.n_text}, self);
                   })
      .def_prop_ro("x",
                   [](nb::handle self) {
                     const kvzap_targets_view v = nb::cast<const Targets&>(self).view();
                     return nb::ndarray<nb::numpy, const float, nb::ndim<3>>(
                         v.x, {(size_t)v.n_sample, (size_t)v.n_layer, (size_t)v.n_embd}, self);
                   })
      .def_prop_ro("sample",
                   [](nb::handle self) {
                     const kvzap_targets_view v = nb::cast<const Targets&>(self).view();
                     return nb::ndarray<nb::numpy, const int64_t, nb::ndim<1>>(v.sample, {(size_t)v.n_sample}, self);
                   })
      .def_prop_ro("text_start", [](const Targets& t) { return t.view().text_start; });

  nb::class_<Sequence>(m, "Sequence")
      .def("prefill", &Sequence::prefill, "ids"_a, "press"_a.none() = nb::none(), "question"_a = "")
      .def("feed", &Sequence::feed, "ids"_a)
      .def("fork",
           [](const Sequence& s) {
             kvzap_sequence* f = nullptr;
             check(locked(*s.mu, [&] { return kvzap_sequence_fork(s.h, &f); }));
             return new Sequence(f, true, s.mu);
           },
           nb::keep_alive<0, 1>())
      .def("logits",
           [](nb::handle self) {
             const Sequence& s = nb::cast<const Sequence&>(self);
             const float* p = nullptr;
             size_t n = 0;
             check(locked(*s.mu, [&] { return kvzap_sequence_logits(s.h, &p, &n); }));
             // A read-only view of the engine's buffer (no copy), valid while the sequence lives and
             // until it changes; the array keeps the sequence alive.
             return nb::ndarray<nb::numpy, const float, nb::ndim<1>>(p, {n}, self);
           })
      .def("start_generation", &Sequence::start_generation, "options"_a = "")
      .def("decode_step", &Sequence::decode_step)
      .def("rewind", &Sequence::rewind, "pos"_a)
      .def("kv_stats", &Sequence::kv_stats)
      .def("kept_mask", &Sequence::kept_mask)
      .def("keep_scores",
           [](Sequence& s, bool on) { check(locked(*s.mu, [&] { return kvzap_sequence_keep_scores(s.h, on ? 1 : 0); })); },
           "on"_a = true)
      .def("press_scores",
           [](nb::handle self) {
             const Sequence& s = nb::cast<const Sequence&>(self);
             kvzap_score_view v{};
             check(locked(*s.mu, [&] { return kvzap_sequence_press_scores(s.h, &v); }));
             // A read-only view of the press's score log (no copy), rows row_stride apart; valid until the
             // sequence changes, and the array keeps the sequence alive.
             static const float kNone = 0.0f;
             const size_t shape[3] = {(size_t)v.n_layer, (size_t)v.n_head_kv, (size_t)v.n_pos};
             const int64_t strides[3] = {v.n_head_kv * v.row_stride, v.row_stride, 1};
             return nb::ndarray<nb::numpy, const float, nb::ndim<3>>(v.scores ? v.scores : &kNone, 3, shape, self, strides);
           })
      .def("save", &Sequence::save, "path"_a)
      .def("load", &Sequence::load, "path"_a);
}
