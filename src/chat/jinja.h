// A small Jinja2 renderer for chat templates: the subset the models' own templates use (Llama 3.x,
// Qwen2.5, Qwen3, SmolLM2, Gemma 3, Mistral), with Hugging Face's apply_chat_template environment:
// trim_blocks and lstrip_blocks on, keep_trailing_newline off, loop controls, a json.dumps-based
// |tojson, raise_exception() and strftime_now(). Values behave like the Python objects jinja2 sees
// (insertion-ordered dicts, lists, str, int, float, bool, None, Undefined).
//
// Whatever the renderer cannot handle is a kvzap::Error "chat template: <what> at line <n>" naming the
// construct — never a silently different prompt.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace kvzap::jinja {

class Value;
using Array = std::vector<Value>;

// Insertion-ordered string-keyed map (a Python dict as JSON builds it).
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  Value* find(const std::string& key);
  void set(const std::string& key, Value v);
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  const Value* kwarg(const std::string& name) const;
};
using Function = std::function<Value(const CallArgs&)>;

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, Array, Object, Function };

  Value() = default;  // undefined
  Value(bool b) : kind_(Kind::Bool), b_(b) {}
  Value(int v) : kind_(Kind::Int), i_(v) {}
  Value(int64_t v) : kind_(Kind::Int), i_(v) {}
  Value(double v) : kind_(Kind::Float), f_(v) {}
  Value(const char* s) : kind_(Kind::String), s_(std::make_shared<std::string>(s)) {}
  Value(std::string s) : kind_(Kind::String), s_(std::make_shared<std::string>(std::move(s))) {}
  static Value none();
  static Value undefined(std::string hint = "");  // hint: what the error says if it is used
  static Value array(Array items = {}, bool tuple = false);
  static Value object(Object o = {}, bool is_namespace = false);
  static Value function(std::string name, Function fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_tuple() const { return kind_ == Kind::Array && tuple_; }
  bool is_object() const { return kind_ == Kind::Object; }
  bool is_namespace() const { return kind_ == Kind::Object && namespace_; }
  bool is_function() const { return kind_ == Kind::Function; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::Bool ? (int64_t)b_ : i_; }
  double as_double() const { return kind_ == Kind::Float ? f_ : (double)as_int(); }
  const std::string& str() const { return *s_; }
  const Array& arr() const { return *a_; }
  Array& arr() { return *a_; }
  const Object& obj() const { return *o_; }
  Object& obj() { return *o_; }
  const Function& fn() const { return *fn_; }
  const std::string& hint() const { return name_; }  // undefined: what was looked up; function: its name
  // Levels of lists and dicts: 0 for a scalar, 1 + the deepest item for a list or dict. A namespace is
  // 1 whatever it holds (nothing recurses into one: repr prints <Namespace>, == compares identity).
  uint32_t depth() const { return depth_; }

  bool truthy() const;                    // Python truthiness (Undefined is false)
  std::string to_str() const;             // Python str() (what {{ }} prints; Undefined prints "")
  std::string repr() const;               // Python repr()
  std::string type_name() const;          // "str", "int", "list", "dict", "NoneType", ...
  bool equals(const Value& o) const;      // Python ==

 private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false, tuple_ = false, namespace_ = false;
  uint32_t depth_ = 0;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<std::string> s_;
  std::shared_ptr<Array> a_;
  std::shared_ptr<Object> o_;
  std::shared_ptr<Function> fn_;
  std::string name_;
};

// JSON in and out (objects keep their key order with ordered_json).
Value from_json(const nlohmann::ordered_json& j);
Value from_json(const nlohmann::json& j);
nlohmann::ordered_json to_json(const Value& v);  // throws for functions

// json.dumps(v, ensure_ascii=False, indent=..., separators=..., sort_keys=...) as HF's |tojson does.
struct JsonStyle {
  int indent = -1;  // -1 = None
  bool custom_separators = false;  // else Python's defaults: (", ", ": "), or (",", ": ") with an indent
  std::string item_sep, key_sep;
  bool sort_keys = false;
  bool ensure_ascii = false;
};
std::string dumps(const Value& v, const JsonStyle& style = {});
std::string py_float_repr(double d);  // repr(float)

struct Node;

class Template {
 public:
  // Parses the template; throws kvzap::Error("chat template: ... at line N") for a syntax error or an
  // unsupported tag.
  explicit Template(const std::string& source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with these variables on top of the globals (range, namespace, dict, raise_exception,
  // strftime_now). Throws kvzap::Error for a runtime error, raise_exception() included, and when the
  // render goes over its work budget: kRenderBaseSteps plus kRenderStepsPerInputStep for every step of
  // input (a byte of text counts 1/8 of a step, a list or dict item 1), so a template that loops forever
  // on nothing ends within about a second even under ASan, while a conversation of any size renders.
  std::string render(const Object& vars) const;
  std::string render(const Object& vars, uint64_t max_steps) const;  // with an explicit budget
  static uint64_t default_budget(const Object& vars);                 // what render(vars) allows
  static constexpr uint64_t kRenderBaseSteps = 1'000'000;
  static constexpr uint64_t kRenderStepsPerInputStep = 128;  // tests/golden templates spend at most ~25

 private:
  std::unique_ptr<Node> root_;
};

}  // namespace kvzap::jinja
