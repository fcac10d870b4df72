// The Jinja value type: Python semantics for truthiness, str(), repr(), ==, and json.dumps.
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "chat/jinja.h"
#include "chat/jinja_internal.h"
#include "kvzap/error.h"
#include "tokenizer/unicode_text.h"

namespace kvzap::jinja {

// ------------------------------------------------------------------------------------------------
// Object, CallArgs

const Value* Object::find(const std::string& key) const {
  for (const auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

Value* Object::find(const std::string& key) {
  for (auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

void Object::set(const std::string& key, Value v) {
  if (Value* old = find(key)) {
    *old = std::move(v);
    return;
  }
  items.emplace_back(key, std::move(v));
}

const Value* CallArgs::kwarg(const std::string& name) const {
  for (const auto& kv : kwargs)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

// ------------------------------------------------------------------------------------------------
// Value

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}

Value Value::undefined(std::string hint) {
  Value v;
  v.name_ = std::move(hint);
  return v;
}

namespace {
// 1 + the deepest of these values, checked against kMaxNesting before the container exists.
template <class It, class Get>
uint32_t container_depth(It begin, It end, Get get) {
  uint32_t d = 0;
  for (It it = begin; it != end; ++it) d = std::max(d, get(*it).depth());
  if (d + 1 > kMaxNesting) fail(0, "lists and dicts nested too deeply (the limit is " + std::to_string(kMaxNesting) + " levels)");
  return d + 1;
}
}  // namespace

Value Value::array(Array items, bool tuple) {
  Value v;
  v.kind_ = Kind::Array;
  v.tuple_ = tuple;
  v.depth_ = container_depth(items.begin(), items.end(), [](const Value& e) -> const Value& { return e; });
  v.a_ = std::make_shared<Array>(std::move(items));
  return v;
}

Value Value::object(Object o, bool is_namespace) {
  Value v;
  v.kind_ = Kind::Object;
  v.namespace_ = is_namespace;
  v.depth_ = is_namespace ? 1 : container_depth(o.items.begin(), o.items.end(), [](const auto& kv) -> const Value& { return kv.second; });
  v.o_ = std::make_shared<Object>(std::move(o));
  return v;
}

Value Value::function(std::string name, Function fn) {
  Value v;
  v.kind_ = Kind::Function;
  v.name_ = std::move(name);
  v.fn_ = std::make_shared<Function>(std::move(fn));
  return v;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b_;
    case Kind::Int: return i_ != 0;
    case Kind::Float: return f_ != 0;
    case Kind::String: return !s_->empty();
    case Kind::Array: return !a_->empty();
    case Kind::Object: return namespace_ || !o_->items.empty();
    case Kind::Function: return true;
  }
  return false;
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest digit string that reads back as the same double.
  char buf[40];
  for (int prec = 1; prec <= 17; prec++) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf = [-]d[.ddd]e[+-]xx
  std::string s = buf;
  bool neg = s[0] == '-';
  if (neg) s.erase(0, 1);
  const size_t e = s.find('e');
  const int exp10 = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; i++)
    if (s[i] != '.') digits += s[i];
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp10 < -4 || exp10 >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  } else if (exp10 < 0) {
    out = "0." + std::string((size_t)(-exp10 - 1), '0') + digits;
  } else {
    const size_t int_len = (size_t)exp10 + 1;
    if (digits.size() <= int_len) {
      out = digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return neg ? "-" + out : out;
}

namespace {

// Python's str.isprintable() for one code point (what repr() leaves unescaped).
bool py_printable(uint32_t cp) {
  if (cp == ' ') return true;
  switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
  }
}

// Calls f(code point, byte offset, byte length) over s; invalid bytes come as U+FFFD of length 1.
template <class F>
void for_each_cp(const std::string& s, F&& f) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = tok::utf8_sequence_length(s, i);
    if (n == 0) {
      f(0xFFFDu, i, (size_t)1);
      i++;
    } else {
      f(tok::utf8_decode_at(s, i, n), i, n);
      i += n;
    }
  }
}

std::string str_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for_each_cp(s, [&](uint32_t cp, size_t at, size_t n) {
    char buf[16];
    if (cp == (uint32_t)q || cp == '\\') {
      out += '\\';
      out += (char)cp;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (!py_printable(cp)) {
      if (cp < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      else if (cp < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      else std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      out += buf;
    } else {
      out.append(s, at, n);
    }
  });
  return out + q;
}

std::string json_string(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  for_each_cp(s, [&](uint32_t cp, size_t at, size_t n) {
    char buf[16];
    switch (cp) {
      case '"': out += "\\\""; return;
      case '\\': out += "\\\\"; return;
      case '\n': out += "\\n"; return;
      case '\r': out += "\\r"; return;
      case '\t': out += "\\t"; return;
      case '\b': out += "\\b"; return;
      case '\f': out += "\\f"; return;
      default: break;
    }
    if (cp < 0x20 || (ensure_ascii && cp > 0x7e)) {
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out += buf;
    } else {
      out.append(s, at, n);
    }
  });
  return out + "\"";
}

// Appends json.dumps(v) to out; every write is size-checked and spends its steps (shared lists can make
// the text far larger than the value's memory).
void dump_to(const Value& v, const JsonStyle& st, int level, std::string& out) {
  const std::string item_sep = st.custom_separators ? st.item_sep : (st.indent >= 0 ? "," : ", ");
  const std::string key_sep = st.custom_separators ? st.key_sep : ": ";
  auto put = [&](std::string_view text) { append_checked(out, text, "JSON text", 0); };
  auto newline = [&](int lv) {
    if (st.indent < 0) return;
    put("\n");
    const size_t width = (size_t)st.indent * (size_t)lv;
    check_size(out.size() + width, kMaxStringBytes, "JSON text", 0);
    spend(width / kBytesPerStep, 0);
    out.append(width, ' ');
  };
  spend(1, 0);
  switch (v.kind()) {
    case Value::Kind::None: put("null"); return;
    case Value::Kind::Bool: put(v.as_bool() ? "true" : "false"); return;
    case Value::Kind::Int: put(std::to_string(v.as_int())); return;
    case Value::Kind::Float: {
      const double d = v.as_double();
      if (std::isnan(d)) put("NaN");
      else if (std::isinf(d)) put(d < 0 ? "-Infinity" : "Infinity");
      else put(py_float_repr(d));
      return;
    }
    case Value::Kind::String: put(json_string(v.str(), st.ensure_ascii)); return;
    case Value::Kind::Array: {
      if (v.arr().empty()) {
        put("[]");
        return;
      }
      put("[");
      for (size_t i = 0; i < v.arr().size(); i++) {
        if (i) put(item_sep);
        newline(level + 1);
        dump_to(v.arr()[i], st, level + 1, out);
      }
      newline(level);
      put("]");
      return;
    }
    case Value::Kind::Object: {
      if (v.is_namespace()) throw Error("Object of type Namespace is not JSON serializable");
      if (v.obj().items.empty()) {
        put("{}");
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.obj().items) items.push_back(&kv);
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      put("{");
      for (size_t i = 0; i < items.size(); i++) {
        if (i) put(item_sep);
        newline(level + 1);
        put(json_string(items[i]->first, st.ensure_ascii));
        put(key_sep);
        dump_to(items[i]->second, st, level + 1, out);
      }
      newline(level);
      put("}");
      return;
    }
    case Value::Kind::Undefined: throw Error("Object of type Undefined is not JSON serializable");
    case Value::Kind::Function: throw Error("Object of type function is not JSON serializable");
  }
}

template <class J>
Value value_from(const J& j, uint32_t depth = 0) {
  // Checked on the way down: a request's JSON may nest far deeper than the stack allows recursing.
  if (depth >= kMaxNesting && (j.is_array() || j.is_object()))
    fail(0, "JSON nested too deeply (the limit is " + std::to_string(kMaxNesting) + " levels)");
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > (uint64_t)INT64_MAX) return Value((double)u);
      return Value((int64_t)u);
    }
    case nlohmann::json::value_t::number_float: return Value(j.template get<double>());
    case nlohmann::json::value_t::string: return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(value_from(e, depth + 1));
      return Value::array(std::move(a));
    }
    case nlohmann::json::value_t::object: {
      Object o;
      for (auto it = j.begin(); it != j.end(); ++it) o.items.emplace_back(it.key(), value_from(it.value(), depth + 1));
      return Value::object(std::move(o));
    }
    default: throw Error("chat template: unsupported JSON value (binary)");
  }
}

}  // namespace

std::string Value::to_str() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::String: return *s_;
    default: return repr();
  }
}

namespace {
// Appends repr(v) to out, size-checked and spending its steps as it goes.
void repr_to(const Value& v, std::string& out) {
  auto put = [&](std::string_view text) { append_checked(out, text, "string", 0); };
  spend(1, 0);
  switch (v.kind()) {
    case Value::Kind::Undefined: return;
    case Value::Kind::None: put("None"); return;
    case Value::Kind::Bool: put(v.as_bool() ? "True" : "False"); return;
    case Value::Kind::Int: put(std::to_string(v.as_int())); return;
    case Value::Kind::Float: put(py_float_repr(v.as_double())); return;
    case Value::Kind::String: put(str_repr(v.str())); return;
    case Value::Kind::Array: {
      put(v.is_tuple() ? "(" : "[");
      for (size_t i = 0; i < v.arr().size(); i++) {
        if (i) put(", ");
        repr_to(v.arr()[i], out);
      }
      if (v.is_tuple() && v.arr().size() == 1) put(",");
      put(v.is_tuple() ? ")" : "]");
      return;
    }
    case Value::Kind::Object: {
      if (v.is_namespace()) {
        put("<Namespace>");
        return;
      }
      put("{");
      for (size_t i = 0; i < v.obj().items.size(); i++) {
        if (i) put(", ");
        put(str_repr(v.obj().items[i].first));
        put(": ");
        repr_to(v.obj().items[i].second, out);
      }
      put("}");
      return;
    }
    case Value::Kind::Function: put("<function " + v.hint() + ">"); return;
  }
}
}  // namespace

std::string Value::repr() const {
  std::string out;
  repr_to(*this, out);
  return out;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::Array: return tuple_ ? "tuple" : "list";
    case Kind::Object: return namespace_ ? "Namespace" : "dict";
    case Kind::Function: return "function";
  }
  return "?";
}

bool Value::equals(const Value& o) const {
  spend(1, 0);
  if (is_number() && o.is_number()) {
    if (kind_ == Kind::Float || o.kind_ == Kind::Float) return as_double() == o.as_double();
    return as_int() == o.as_int();
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String:
      spend(std::min(s_->size(), o.s_->size()) / kBytesPerStep, 0);
      return *s_ == *o.s_;
    case Kind::Array: {
      if (tuple_ != o.tuple_ || a_->size() != o.a_->size()) return false;
      if (a_ == o.a_) return true;  // the same list (Python's == checks identity first too)
      for (size_t i = 0; i < a_->size(); i++)
        if (!(*a_)[i].equals((*o.a_)[i])) return false;
      return true;
    }
    case Kind::Object: {
      if (namespace_ || o.namespace_) return o_ == o.o_;
      if (o_->items.size() != o.o_->items.size()) return false;
      for (const auto& kv : o_->items) {
        const Value* other = o.o_->find(kv.first);
        if (!other || !kv.second.equals(*other)) return false;
      }
      return true;
    }
    case Kind::Function: return fn_ == o.fn_;
    default: return false;
  }
}

Value from_json(const nlohmann::ordered_json& j) { return value_from(j); }
Value from_json(const nlohmann::json& j) { return value_from(j); }

nlohmann::ordered_json to_json(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return nullptr;
    case Value::Kind::Bool: return v.as_bool();
    case Value::Kind::Int: return v.as_int();
    case Value::Kind::Float: return v.as_double();
    case Value::Kind::String: return v.str();
    case Value::Kind::Array: {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (const Value& e : v.arr()) a.push_back(to_json(e));
      return a;
    }
    case Value::Kind::Object: {
      if (v.is_namespace()) throw Error("chat template: a namespace is not a JSON value");
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const auto& kv : v.obj().items) o[kv.first] = to_json(kv.second);
      return o;
    }
    case Value::Kind::Function: throw Error("chat template: a function is not a JSON value");
  }
  return nullptr;
}

std::string dumps(const Value& v, const JsonStyle& style) {
  std::string out;
  dump_to(v, style, 0, out);
  return out;
}

}  // namespace kvzap::jinja
