// Jinja built-ins with Python semantics: operators, attribute/item access (dict, str and list methods,
// with the immutable sandbox refusing the modifying ones), filters, tests and the globals of HF's
// chat-template environment.
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <cstring>
#include <string_view>

#include "chat/jinja_internal.h"
#include "kvzap/error.h"
#include "tokenizer/unicode_text.h"

namespace kvzap::jinja {

// ------------------------------------------------------------------------------------------------
// UTF-8

size_t cp_len(const std::string& s, size_t i) {
  const size_t n = tok::utf8_sequence_length(s, i);
  return n == 0 ? 1 : n;
}

uint32_t decode_cp(const std::string& s, size_t i) {
  const size_t n = tok::utf8_sequence_length(s, i);
  return n == 0 ? 0xFFFDu : tok::utf8_decode_at(s, i, n);
}

void append_cp(std::string& out, uint32_t cp) { tok::utf8_append(out, cp); }

bool is_space_cp(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {

bool is_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

std::vector<uint32_t> to_cps(const std::string& s) {
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < s.size(); i += cp_len(s, i)) cps.push_back(decode_cp(s, i));
  return cps;
}

std::string from_cps(const std::vector<uint32_t>& cps, size_t b, size_t e) {
  std::string out;
  for (size_t i = b; i < e; i++) append_cp(out, cps[i]);
  return out;
}

// Substring search in time linear in the haystack, as Python's is: std::string::find compares about
// haystack x needle bytes in the worst case ('a' * 10**5 + 'b' in 'a' * 10**6), so needles longer than
// kShortNeedle go to glibc's memmem (the two-way algorithm: linear). rfind runs it on reversed copies.
constexpr size_t kShortNeedle = 32;

size_t find_in(std::string_view hay, std::string_view needle, size_t from) {
  if (from > hay.size()) return std::string_view::npos;
  if (needle.size() <= kShortNeedle) return hay.find(needle, from);
  const void* at = memmem(hay.data() + from, hay.size() - from, needle.data(), needle.size());
  return at ? (size_t)(static_cast<const char*>(at) - hay.data()) : std::string_view::npos;
}

// Repeated rfind over one haystack (rsplit): the reversed copies are made once.
class ReverseFinder {
 public:
  ReverseFinder(std::string_view hay, std::string_view needle) : hay_(hay), needle_(needle) {
    if (needle.size() > kShortNeedle) {
      rhay_.assign(hay.rbegin(), hay.rend());
      rneedle_.assign(needle.rbegin(), needle.rend());
    }
  }
  // Last start <= last_start, or npos.
  size_t rfind(size_t last_start) const {
    if (needle_.size() <= kShortNeedle) return hay_.rfind(needle_, last_start);
    if (needle_.size() > hay_.size()) return std::string_view::npos;
    const size_t end = std::min(last_start, hay_.size() - needle_.size()) + needle_.size();  // one past the match
    const size_t r = find_in(rhay_, rneedle_, hay_.size() - end);  // the match's end, counted from the back
    return r == std::string_view::npos ? r : hay_.size() - r - needle_.size();
  }

 private:
  std::string_view hay_, needle_;
  std::string rhay_, rneedle_;
};

int64_t cp_count(const std::string& s) {
  if (is_ascii(s)) return (int64_t)s.size();
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); i += cp_len(s, i)) n++;
  return n;
}

std::string map_case(const std::string& s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); i += cp_len(s, i)) {
    const uint32_t cp = decode_cp(s, i);
    append_cp(out, (uint32_t)(upper ? utf8proc_toupper((utf8proc_int32_t)cp) : utf8proc_tolower((utf8proc_int32_t)cp)));
  }
  return out;
}

bool is_cased_letter(uint32_t cp) {
  const auto c = utf8proc_category((utf8proc_int32_t)cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

// Python's str.title(): a cased letter after an uncased character starts a word.
std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size(); i += cp_len(s, i)) {
    const uint32_t cp = decode_cp(s, i);
    const bool cased = is_cased_letter(cp);
    append_cp(out, (uint32_t)(cased && !prev_cased ? utf8proc_toupper((utf8proc_int32_t)cp) : utf8proc_tolower((utf8proc_int32_t)cp)));
    prev_cased = cased;
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  if (s.empty()) return s;
  const size_t l = cp_len(s, 0);
  std::string out;
  append_cp(out, (uint32_t)utf8proc_toupper((utf8proc_int32_t)decode_cp(s, 0)));
  return out + map_case(s.substr(l), false);
}

// str.strip([chars]); which: 1 = left, 2 = right, 3 = both.
std::string py_strip(const std::string& s, const Value* chars, int which) {
  const bool custom = chars && !chars->is_none() && !chars->is_undefined();
  if (custom && !chars->is_string()) fail(0, "strip arg must be None or str");
  std::vector<uint32_t> set = custom ? to_cps(chars->str()) : std::vector<uint32_t>{};
  std::sort(set.begin(), set.end());  // a binary search per code point: chars may be long too
  auto strip_it = [&](uint32_t cp) { return custom ? std::binary_search(set.begin(), set.end(), cp) : is_space_cp(cp); };
  size_t b = 0, e = s.size();
  if (which & 1)
    while (b < e && strip_it(decode_cp(s, b))) b += cp_len(s, b);
  if (which & 2)
    while (e > b) {
      size_t p = e - 1;
      while (p > b && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
      if (!strip_it(decode_cp(s, p))) break;
      e = p;
    }
  return s.substr(b, e - b);
}

Value py_split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
  Array parts;
  if (!sep || sep->is_none() || sep->is_undefined()) {  // runs of whitespace, no empty parts
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && is_space_cp(decode_cp(s, i))) i += cp_len(s, i);
      if (i >= s.size()) break;
      size_t j = i;
      while (j < s.size() && !is_space_cp(decode_cp(s, j))) j += cp_len(s, j);
      spend(1, 0);  // every word becomes a list item
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit < 0 || (int64_t)words.size() <= maxsplit + 1) {
      for (auto& w : words) parts.emplace_back(s.substr(w.first, w.second - w.first));
    } else if (!from_right) {
      for (int64_t k = 0; k < maxsplit; k++) parts.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
      parts.emplace_back(py_strip(s.substr(words[(size_t)maxsplit].first), nullptr, 2));
    } else {
      const size_t keep = words.size() - (size_t)maxsplit;
      parts.emplace_back(py_strip(s.substr(0, words[keep - 1].second), nullptr, 1));
      for (size_t k = keep; k < words.size(); k++) parts.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
    }
    return Value::array(std::move(parts));
  }
  if (!sep->is_string()) fail(0, "must be str or None, not " + sep->type_name());
  const std::string& d = sep->str();
  if (d.empty()) fail(0, "empty separator");
  std::vector<size_t> cuts;
  if (!from_right) {
    for (size_t p = find_in(s, d, 0); p != std::string::npos && (maxsplit < 0 || (int64_t)cuts.size() < maxsplit);
         p = find_in(s, d, p + d.size())) {
      spend(1, 0);  // every cut makes a list item
      cuts.push_back(p);
    }
  } else {
    const ReverseFinder finder(s, d);
    size_t end = s.size();
    while ((maxsplit < 0 || (int64_t)cuts.size() < maxsplit) && end >= d.size()) {
      const size_t p = finder.rfind(end - d.size());
      if (p == std::string::npos) break;
      spend(1, 0);
      cuts.push_back(p);
      end = p;
    }
    std::reverse(cuts.begin(), cuts.end());
  }
  size_t from = 0;
  for (size_t c : cuts) {
    parts.emplace_back(s.substr(from, c - from));
    from = c + d.size();
  }
  parts.emplace_back(s.substr(from));
  return Value::array(std::move(parts));
}

// The result can be far longer than s ('a' * 10**6).replace('a', 'a' * 1000): every append is checked.
std::string py_replace(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  std::string out;
  auto put = [&](std::string_view text) { append_checked(out, text, "string", 0); };
  const std::string_view all(s);
  if (old.empty()) {
    int64_t done = 0;
    for (size_t i = 0; i <= s.size();) {
      if (count < 0 || done < count) {
        put(with);
        done++;
      }
      if (i == s.size()) break;
      const size_t l = cp_len(s, i);
      put(all.substr(i, l));
      i += l;
    }
    return out;
  }
  size_t from = 0;
  int64_t done = 0;
  for (size_t p = find_in(s, old, 0); p != std::string::npos && (count < 0 || done < count); p = find_in(s, old, from)) {
    put(all.substr(from, p - from));
    put(with);
    from = p + old.size();
    done++;
  }
  put(all.substr(from));
  return out;
}

Value py_splitlines(const std::string& s, bool keepends) {
  Array lines;
  size_t b = 0, i = 0;
  while (i < s.size()) {
    const uint32_t cp = decode_cp(s, i);
    const size_t l = cp_len(s, i);
    const bool brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
                     cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!brk) {
      i += l;
      continue;
    }
    size_t e = i + l;
    if (cp == '\r' && e < s.size() && s[e] == '\n') e++;
    spend(1, 0);  // every line becomes a list item
    lines.emplace_back(s.substr(b, (keepends ? e : i) - b));
    b = i = e;
  }
  if (b < s.size()) lines.emplace_back(s.substr(b));
  return Value::array(std::move(lines));
}

const Value* arg(const CallArgs& a, size_t pos, const char* name) {
  if (pos < a.args.size()) return &a.args[pos];
  return a.kwarg(name);
}

bool arg_bool(const CallArgs& a, size_t pos, const char* name, bool dflt) {
  const Value* v = arg(a, pos, name);
  return v ? v->truthy() : dflt;
}

int64_t arg_int(const CallArgs& a, size_t pos, const char* name, int64_t dflt) {
  const Value* v = arg(a, pos, name);
  if (!v || v->is_none()) return dflt;
  if (!v->is_number() || v->is_float()) fail(0, std::string("argument '") + name + "' must be an integer");
  return v->as_int();
}

std::string arg_str(const CallArgs& a, size_t pos, const char* name, const std::string& dflt) {
  const Value* v = arg(a, pos, name);
  return v ? v->to_str() : dflt;
}

const std::string& need_str(const Value* v, const char* what) {
  if (!v || !v->is_string()) fail(0, std::string(what) + " must be a string");
  return v->str();
}

[[noreturn]] void undefined_error(const Value& v, int line) { fail(line, v.hint().empty() ? "undefined value" : v.hint()); }

int64_t py_len(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return cp_count(v.str());
    case Value::Kind::Array: return (int64_t)v.arr().size();
    case Value::Kind::Object: return (int64_t)v.obj().items.size();
    default: fail(line, "object of type '" + v.type_name() + "' has no len()");
  }
}

std::string attr_hint(const Value& obj, const std::string& name) {
  if (obj.is_none()) return "'None' has no attribute '" + name + "'";
  return "'" + obj.type_name() + " object' has no attribute '" + name + "'";
}

// A bound method; calling it spends the size of self (the methods take time in proportion to it).
Value method(const Value& self, const std::string& name, std::function<Value(const Value&, const CallArgs&)> f) {
  return Value::function(name, [self, f](const CallArgs& a) {
    spend(size_steps(self), 0);
    return f(self, a);
  });
}

[[noreturn]] void unsafe(const Value& obj, const std::string& name, int line) {
  fail(line, "access to attribute '" + name + "' of '" + obj.type_name() + "' object is unsafe (the template modifies a value)");
}

Value str_method(const Value& self, const std::string& name) {
  using A = const CallArgs&;
  using V = const Value&;
  if (name == "startswith" || name == "endswith") {
    const bool starts = name == "startswith";
    return method(self, name, [starts](V s, A a) {
      const Value* p = arg(a, 0, "prefix");
      if (!p) fail(0, "startswith/endswith needs an argument");
      std::vector<std::string> cands;
      if (p->is_string()) cands.push_back(p->str());
      else if (p->is_array())
        for (const Value& e : p->arr()) cands.push_back(need_str(&e, "prefix"));
      else fail(0, "startswith/endswith first arg must be str or a tuple of str");
      const std::string& str = s.str();
      for (const std::string& c : cands) {
        if (c.size() > str.size()) continue;
        if (starts ? str.compare(0, c.size(), c) == 0 : str.compare(str.size() - c.size(), c.size(), c) == 0) return Value(true);
      }
      return Value(false);
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const int which = name == "strip" ? 3 : name == "lstrip" ? 1 : 2;
    return method(self, name, [which](V s, A a) { return Value(py_strip(s.str(), arg(a, 0, "chars"), which)); });
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return method(self, name, [right](V s, A a) { return py_split(s.str(), arg(a, 0, "sep"), arg_int(a, 1, "maxsplit", -1), right); });
  }
  if (name == "splitlines")
    return method(self, name, [](V s, A a) { return py_splitlines(s.str(), arg_bool(a, 0, "keepends", false)); });
  if (name == "replace")
    return method(self, name, [](V s, A a) {
      return Value(py_replace(s.str(), need_str(arg(a, 0, "old"), "old"), need_str(arg(a, 1, "new"), "new"), arg_int(a, 2, "count", -1)));
    });
  if (name == "upper") return method(self, name, [](V s, A) { return Value(map_case(s.str(), true)); });
  if (name == "lower") return method(self, name, [](V s, A) { return Value(map_case(s.str(), false)); });
  if (name == "title") return method(self, name, [](V s, A) { return Value(py_title(s.str())); });
  if (name == "capitalize") return method(self, name, [](V s, A) { return Value(py_capitalize(s.str())); });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return method(self, name, [name](V s, A a) {
      const std::string& sub = need_str(arg(a, 0, "sub"), "substring");
      const std::string& str = s.str();
      if (name == "count") {
        if (sub.empty()) return Value(cp_count(str) + 1);
        int64_t n = 0;
        for (size_t p = find_in(str, sub, 0); p != std::string::npos; p = find_in(str, sub, p + sub.size())) n++;
        return Value(n);
      }
      const size_t p = name[0] == 'r' ? ReverseFinder(str, sub).rfind(std::string::npos) : find_in(str, sub, 0);
      if (p == std::string::npos) {
        if (name == "index" || name == "rindex") fail(0, "substring not found");
        return Value(-1);
      }
      return Value(cp_count(str.substr(0, p)));
    });
  }
  if (name == "join")
    return method(self, name, [](V s, A a) {
      const Value* it = arg(a, 0, "iterable");
      if (!it) fail(0, "join() needs an argument");
      std::string out;
      bool first = true;
      for (const Value& e : iterate_value(*it, 0)) {
        if (!e.is_string()) fail(0, "sequence item: expected str instance, " + e.type_name() + " found");
        if (!first) append_checked(out, s.str(), "string", 0);
        first = false;
        append_checked(out, e.str(), "string", 0);
      }
      return Value(out);
    });
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" || name == "islower") {
    return method(self, name, [name](V s, A) {
      const std::string& str = s.str();
      if (str.empty()) return Value(false);
      bool any_cased = false;
      for (size_t i = 0; i < str.size(); i += cp_len(str, i)) {
        const uint32_t cp = decode_cp(str, i);
        const auto c = utf8proc_category((utf8proc_int32_t)cp);
        const bool letter = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
        const bool digit = c == UTF8PROC_CATEGORY_ND;
        if (name == "isdigit" && !digit) return Value(false);
        if (name == "isalpha" && !letter) return Value(false);
        if (name == "isalnum" && !letter && !digit && c != UTF8PROC_CATEGORY_NL && c != UTF8PROC_CATEGORY_NO) return Value(false);
        if (name == "isspace" && !is_space_cp(cp)) return Value(false);
        if (name == "isupper" || name == "islower") {
          if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LT) {
            any_cased = true;
            if (name == "islower") return Value(false);
          } else if (c == UTF8PROC_CATEGORY_LL) {
            any_cased = true;
            if (name == "isupper") return Value(false);
          }
        }
      }
      if (name == "isupper" || name == "islower") return Value(any_cased);
      return Value(true);
    });
  }
  return Value::undefined(attr_hint(self, name));
}

Value dict_method(const Value& self, const std::string& name, int line) {
  using A = const CallArgs&;
  using V = const Value&;
  if (name == "get")
    return method(self, name, [](V d, A a) {
      const Value* k = arg(a, 0, "key");
      if (!k) fail(0, "get() needs a key");
      if (k->is_string())
        if (const Value* v = d.obj().find(k->str())) return *v;
      const Value* dflt = arg(a, 1, "default");
      return dflt ? *dflt : Value::none();
    });
  if (name == "items")
    return method(self, name, [](V d, A) {
      Array out;
      for (const auto& kv : d.obj().items) out.push_back(Value::array({Value(kv.first), kv.second}, true));
      return Value::array(std::move(out));
    });
  if (name == "keys")
    return method(self, name, [](V d, A) {
      Array out;
      for (const auto& kv : d.obj().items) out.emplace_back(kv.first);
      return Value::array(std::move(out));
    });
  if (name == "values")
    return method(self, name, [](V d, A) {
      Array out;
      for (const auto& kv : d.obj().items) out.push_back(kv.second);
      return Value::array(std::move(out));
    });
  if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" || name == "clear") unsafe(self, name, line);
  return Value::undefined();  // not a method: the caller looks the key up
}

Value list_method(const Value& self, const std::string& name, int line) {
  using A = const CallArgs&;
  using V = const Value&;
  if (name == "count")
    return method(self, name, [](V l, A a) {
      const Value* x = arg(a, 0, "x");
      int64_t n = 0;
      for (const Value& e : l.arr()) n += x && e.equals(*x);
      return Value(n);
    });
  if (name == "index")
    return method(self, name, [](V l, A a) {
      const Value* x = arg(a, 0, "x");
      for (size_t k = 0; k < l.arr().size(); k++)
        if (x && l.arr()[k].equals(*x)) return Value((int64_t)k);
      fail(0, "value is not in list");
    });
  if (!self.is_tuple() && (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
                           name == "reverse" || name == "sort" || name == "clear"))
    unsafe(self, name, line);
  return Value::undefined(attr_hint(self, name));
}

Value index_seq(const Value& obj, int64_t idx) {
  if (obj.is_array()) {
    const int64_t n = (int64_t)obj.arr().size();
    const int64_t k = idx < 0 ? idx + n : idx;
    if (k < 0 || k >= n) return Value::undefined("list index " + std::to_string(idx) + " out of range");
    return obj.arr()[(size_t)k];
  }
  const std::string& s = obj.str();
  if (is_ascii(s)) {
    const int64_t n = (int64_t)s.size();
    const int64_t k = idx < 0 ? idx + n : idx;
    if (k < 0 || k >= n) return Value::undefined("string index " + std::to_string(idx) + " out of range");
    return Value(s.substr((size_t)k, 1));
  }
  const std::vector<uint32_t> cps = to_cps(s);
  const int64_t n = (int64_t)cps.size();
  const int64_t k = idx < 0 ? idx + n : idx;
  if (k < 0 || k >= n) return Value::undefined("string index " + std::to_string(idx) + " out of range");
  return Value(from_cps(cps, (size_t)k, (size_t)k + 1));
}

// Python's ordering for <, >, sorting and min/max.
int py_cmp(const Value& l, const Value& r, int line) {
  spend(1, line);
  if (l.is_undefined()) undefined_error(l, line);
  if (r.is_undefined()) undefined_error(r, line);
  if (l.is_number() && r.is_number()) {
    if (l.is_float() || r.is_float()) {
      const double a = l.as_double(), b = r.as_double();
      return a < b ? -1 : a > b ? 1 : 0;
    }
    return l.as_int() < r.as_int() ? -1 : l.as_int() > r.as_int() ? 1 : 0;
  }
  if (l.is_string() && r.is_string()) {
    const int c = l.str().compare(r.str());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (l.is_array() && r.is_array() && l.is_tuple() == r.is_tuple()) {
    const size_t n = std::min(l.arr().size(), r.arr().size());
    for (size_t k = 0; k < n; k++) {
      if (l.arr()[k].equals(r.arr()[k])) continue;
      return py_cmp(l.arr()[k], r.arr()[k], line);
    }
    return l.arr().size() < r.arr().size() ? -1 : l.arr().size() > r.arr().size() ? 1 : 0;
  }
  fail(line, "'<' not supported between instances of '" + l.type_name() + "' and '" + r.type_name() + "'");
}

// printf-style "fmt % args" for %s %r %d %i %f %%.
std::string percent_format(const std::string& fmt, const Value& args, int line) {
  Array list = args.is_tuple() ? args.arr() : Array{args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); i++) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail(line, "incomplete format");
    const char c = fmt[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next >= list.size()) fail(line, "not enough arguments for format string");
    const Value& v = list[next++];
    if (c == 's') append_checked(out, v.to_str(), "string", line);
    else if (c == 'r') append_checked(out, v.repr(), "string", line);
    else if (c == 'd' || c == 'i') {
      if (!v.is_number()) fail(line, "%d format: a real number is required, not " + v.type_name());
      out += std::to_string(v.is_float() ? (int64_t)std::trunc(v.as_double()) : v.as_int());
    } else if (c == 'f') {
      if (!v.is_number()) fail(line, "%f format: a real number is required, not " + v.type_name());
      char buf[64];
      std::snprintf(buf, sizeof buf, "%f", v.as_double());
      out += buf;
    } else {
      fail(line, std::string("unsupported construct: '%") + c + "' string formatting");
    }
  }
  if (next < list.size()) fail(line, "not all arguments converted during string formatting");
  return out;
}

Value attribute_path(const Value& item, const std::string& path, int line) {
  Value cur = item;
  size_t from = 0;
  while (true) {
    const size_t dot = path.find('.', from);
    const std::string part = path.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
    if (cur.is_undefined()) return cur;
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit((unsigned char)c); });
    cur = numeric ? get_item(cur, Value((int64_t)std::stoll(part)), line) : get_item(cur, Value(part), line);
    if (dot == std::string::npos) return cur;
    from = dot + 1;
  }
}

// select / reject / selectattr / rejectattr: args are (test name, test args...) after an optional attribute.
Value select_items(const Value& seq, const CallArgs& a, bool keep, bool by_attr, int line) {
  size_t k = 0;
  std::string attr;
  if (by_attr) {
    if (a.args.empty() || !a.args[0].is_string()) fail(line, "selectattr/rejectattr needs an attribute name");
    attr = a.args[0].str();
    k = 1;
  }
  std::string test;
  CallArgs targs;
  if (k < a.args.size()) {
    if (!a.args[k].is_string()) fail(line, "the test name must be a string");
    test = a.args[k].str();
    targs.args.assign(a.args.begin() + (long)k + 1, a.args.end());
  }
  Array out;
  for (const Value& item : iterate_value(seq, line)) {
    const Value v = by_attr ? attribute_path(item, attr, line) : item;
    const bool ok = test.empty() ? v.truthy() : call_test(test, v, targs, line);
    if (ok == keep) out.push_back(item);
  }
  return Value::array(std::move(out));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(map_case(v.str(), false));
  return v;
}

}  // namespace

// Python iteration: an array, a mapping's keys, a string's code points; undefined is empty.
// Spends one step per item before making them (a 64 MiB string would be 64 M values).
Array iterate_value(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::Array: spend(v.arr().size(), line); return v.arr();
    case Value::Kind::Object: {
      spend(v.obj().items.size(), line);
      Array keys;
      for (const auto& kv : v.obj().items) keys.emplace_back(kv.first);
      return keys;
    }
    case Value::Kind::String: {
      spend(v.str().size(), line);
      Array chars;
      const std::string& s = v.str();
      for (size_t i = 0; i < s.size(); i += cp_len(s, i)) chars.emplace_back(s.substr(i, cp_len(s, i)));
      return chars;
    }
    default: fail(line, "'" + v.type_name() + "' object is not iterable");
  }
}


// ------------------------------------------------------------------------------------------------
// Access

Value get_attr(const Value& obj, const std::string& name, int line) {
  if (obj.is_object()) spend(size_steps(obj), line);  // a linear search of the keys
  switch (obj.kind()) {
    case Value::Kind::Undefined: undefined_error(obj, line);
    case Value::Kind::Object: {
      if (obj.is_namespace()) {
        if (const Value* v = obj.obj().find(name)) return *v;
        return Value::undefined("'Namespace' has no attribute '" + name + "'");
      }
      Value m = dict_method(obj, name, line);
      if (!m.is_undefined()) return m;
      if (const Value* v = obj.obj().find(name)) return *v;
      return Value::undefined(attr_hint(obj, name));
    }
    case Value::Kind::String: return str_method(obj, name);
    case Value::Kind::Array: return list_method(obj, name, line);
    default: return Value::undefined(attr_hint(obj, name));
  }
}

Value get_item(const Value& obj, const Value& key, int line) {
  if (obj.is_object() || obj.is_string()) spend(size_steps(obj), line);  // key search; code point indexing
  switch (obj.kind()) {
    case Value::Kind::Undefined: undefined_error(obj, line);
    case Value::Kind::Object: {
      if (key.is_string()) {
        if (const Value* v = obj.obj().find(key.str())) return *v;
        if (!obj.is_namespace()) {
          Value m = dict_method(obj, key.str(), line);
          if (!m.is_undefined()) return m;
        }
        return Value::undefined(attr_hint(obj, key.str()));
      }
      return Value::undefined(attr_hint(obj, key.to_str()));
    }
    case Value::Kind::Array:
    case Value::Kind::String:
      if (key.is_number() && !key.is_float()) return index_seq(obj, key.as_int());
      if (key.is_string()) return get_attr(obj, key.str(), line);
      return Value::undefined(attr_hint(obj, key.to_str()));
    default: return Value::undefined(attr_hint(obj, key.to_str()));
  }
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line) {
  if (!obj.is_array() && !obj.is_string()) fail(line, "'" + obj.type_name() + "' object is not subscriptable");
  auto bound = [&](const Value& v, bool& given) -> int64_t {
    given = !(v.is_undefined() || v.is_none());
    if (!given) return 0;
    if (!v.is_number() || v.is_float()) fail(line, "slice indices must be integers or None");
    return v.as_int();
  };
  bool has_start, has_stop, has_step;
  int64_t b = bound(start, has_start), e = bound(stop, has_stop), st = bound(step, has_step);
  if (!has_step) st = 1;
  if (st == 0) fail(line, "slice step cannot be zero");
  const bool ascii = obj.is_string() && is_ascii(obj.str());
  std::vector<uint32_t> cps;
  if (obj.is_string() && !ascii) cps = to_cps(obj.str());
  const int64_t n = obj.is_array() ? (int64_t)obj.arr().size() : ascii ? (int64_t)obj.str().size() : (int64_t)cps.size();
  auto clamp = [&](int64_t v, bool given, bool is_start) -> int64_t {
    if (!given) return st > 0 ? (is_start ? 0 : n) : (is_start ? n - 1 : -1);
    if (v < 0) {
      v += n;
      if (v < 0) v = st > 0 ? 0 : -1;
    } else if (v >= n) {
      v = st > 0 ? n : n - 1;
    }
    return v;
  };
  b = clamp(b, has_start, true);
  e = clamp(e, has_stop, false);
  std::vector<int64_t> idx;
  if (st > 0)
    for (int64_t k = b; k < e; k += st) idx.push_back(k);
  else
    for (int64_t k = b; k > e; k += st) idx.push_back(k);
  if (obj.is_array()) {
    Array out;
    for (int64_t k : idx) out.push_back(obj.arr()[(size_t)k]);
    return Value::array(std::move(out), obj.is_tuple());
  }
  std::string out;
  for (int64_t k : idx) {
    if (ascii) out += obj.str()[(size_t)k];
    else append_cp(out, cps[(size_t)k]);
  }
  return Value(out);
}

// ------------------------------------------------------------------------------------------------
// Operators

static Value run_binary_op(const std::string& op, const Value& l, const Value& r, int line) {
  if (l.is_undefined()) undefined_error(l, line);
  if (r.is_undefined()) undefined_error(r, line);
  auto type_error = [&]() -> Value {
    fail(line, "unsupported operand type(s) for " + op + ": '" + l.type_name() + "' and '" + r.type_name() + "'");
  };
  const bool nums = l.is_number() && r.is_number();
  const bool any_float = l.is_float() || r.is_float();
  // Python's integers do not overflow; ours are int64: a result out of range is an error, not UB.
  auto overflow = [&]() -> Value { fail(line, "integer overflow in '" + op + "' (integers are 64-bit here)"); };
  auto int_op = [&](bool (*f)(int64_t, int64_t, int64_t*)) -> Value {
    int64_t v = 0;
    return f(l.as_int(), r.as_int(), &v) ? overflow() : Value(v);
  };
  auto add = [](int64_t a, int64_t b, int64_t* v) { return __builtin_add_overflow(a, b, v); };
  auto subtract = [](int64_t a, int64_t b, int64_t* v) { return __builtin_sub_overflow(a, b, v); };
  auto multiply = [](int64_t a, int64_t b, int64_t* v) { return __builtin_mul_overflow(a, b, v); };
  if (op == "+") {
    if (nums) return any_float ? Value(l.as_double() + r.as_double()) : int_op(add);
    if (l.is_string() && r.is_string()) {
      check_size(l.str().size() + r.str().size(), kMaxStringBytes, "string", line);
      return Value(l.str() + r.str());
    }
    if (l.is_array() && r.is_array() && l.is_tuple() == r.is_tuple()) {
      check_size(l.arr().size() + r.arr().size(), kMaxArrayItems, "list", line);
      Array out = l.arr();
      out.insert(out.end(), r.arr().begin(), r.arr().end());
      return Value::array(std::move(out), l.is_tuple());
    }
    return type_error();
  }
  if (op == "-") {
    if (!nums) return type_error();
    return any_float ? Value(l.as_double() - r.as_double()) : int_op(subtract);
  }
  if (op == "*") {
    if (nums) return any_float ? Value(l.as_double() * r.as_double()) : int_op(multiply);
    const Value* seq = l.is_string() || l.is_array() ? &l : r.is_string() || r.is_array() ? &r : nullptr;
    const Value* cnt = seq == &l ? &r : &l;
    if (!seq || !cnt->is_number() || cnt->is_float()) return type_error();
    const int64_t times = std::max<int64_t>(0, cnt->as_int());
    // Checked before building: the product itself may overflow size_t.
    const size_t unit = seq->is_string() ? seq->str().size() : seq->arr().size();
    size_t total = 0;
    if (__builtin_mul_overflow(unit, static_cast<uint64_t>(times), &total)) total = SIZE_MAX;
    check_size(total, seq->is_string() ? kMaxStringBytes : kMaxArrayItems, seq->is_string() ? "string" : "list",
               line);
    if (seq->is_string()) {
      std::string out;
      out.reserve(total);
      for (int64_t k = 0; k < times; k++) out += seq->str();
      return Value(out);
    }
    Array out;
    out.reserve(total);
    for (int64_t k = 0; k < times; k++) out.insert(out.end(), seq->arr().begin(), seq->arr().end());
    return Value::array(std::move(out), seq->is_tuple());
  }
  if (op == "/") {
    if (!nums) return type_error();
    if (r.as_double() == 0) fail(line, "division by zero");
    return Value(l.as_double() / r.as_double());
  }
  if (op == "//") {
    if (!nums) return type_error();
    if (r.as_double() == 0) fail(line, "integer division or modulo by zero");
    if (any_float) return Value(std::floor(l.as_double() / r.as_double()));
    const int64_t a = l.as_int(), b = r.as_int();
    if (a == INT64_MIN && b == -1) return overflow();
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return Value(q);
  }
  if (op == "%") {
    if (l.is_string()) return Value(percent_format(l.str(), r, line));
    if (!nums) return type_error();
    if (r.as_double() == 0) fail(line, "integer division or modulo by zero");
    if (any_float) {
      const double a = l.as_double(), b = r.as_double();
      double m = std::fmod(a, b);
      if (m != 0 && ((m < 0) != (b < 0))) m += b;
      return Value(m);
    }
    const int64_t a = l.as_int(), b = r.as_int();
    if (b == -1) return Value((int64_t)0);  // a % -1 is 0 (INT64_MIN % -1 is UB in C++)
    int64_t m = a % b;
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return Value(m);
  }
  if (op == "**") {
    if (!nums) return type_error();
    if (!any_float && r.as_int() >= 0) {
      // Square-and-multiply: at most 63 steps whatever the exponent, each checked.
      int64_t out = 1, base = l.as_int(), e = r.as_int();
      bool over = false;
      while (e > 0 && !over) {
        if (e & 1) over = __builtin_mul_overflow(out, base, &out);
        e >>= 1;
        if (e > 0 && !over) over = __builtin_mul_overflow(base, base, &base);
      }
      return over ? overflow() : Value(out);
    }
    return Value(std::pow(l.as_double(), r.as_double()));
  }
  fail(line, "unsupported operator '" + op + "'");
}

Value binary_op(const std::string& op, const Value& l, const Value& r, int line) {
  spend(text_steps(l) + text_steps(r), line);
  Value out = run_binary_op(op, l, r, line);
  spend_result(out, line);
  if (out.is_array()) spend(out.arr().size(), line);  // + and * built it
  return out;
}

bool compare_op(const std::string& op, const Value& l, const Value& r, int line) {
  spend(text_steps(l) + text_steps(r), line);
  if (op == "==") return l.equals(r);
  if (op == "!=") return !l.equals(r);
  if (op == "in" || op == "not in") {
    bool found = false;
    switch (r.kind()) {
      case Value::Kind::Undefined: found = false; break;
      case Value::Kind::String:
        if (!l.is_string()) fail(line, "'in <string>' requires string as left operand, not " + l.type_name());
        found = find_in(r.str(), l.str(), 0) != std::string::npos;
        break;
      case Value::Kind::Array:
        for (const Value& e : r.arr())
          if (e.equals(l)) {
            found = true;
            break;
          }
        break;
      case Value::Kind::Object: found = l.is_string() && r.obj().find(l.str()) != nullptr; break;
      default: fail(line, "argument of type '" + r.type_name() + "' is not iterable");
    }
    return op == "in" ? found : !found;
  }
  const int c = py_cmp(l, r, line);
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  if (op == ">=") return c >= 0;
  fail(line, "unsupported comparison '" + op + "'");
}

// ------------------------------------------------------------------------------------------------
// Filters

static Value run_filter(const std::string& name, const Value& v, const CallArgs& a, int line) {
  const std::string& f = name;
  if (f == "trim") return Value(py_strip(v.to_str(), arg(a, 0, "chars"), 3));
  if (f == "tojson") {
    JsonStyle st;
    st.ensure_ascii = arg_bool(a, 0, "ensure_ascii", false);
    if (const Value* ind = arg(a, 1, "indent"); ind && !ind->is_none()) {
      if (!ind->is_number() || ind->is_float()) fail(line, "tojson: indent must be an integer");
      st.indent = (int)std::max<int64_t>(0, ind->as_int());
    }
    if (const Value* sep = arg(a, 2, "separators"); sep && !sep->is_none()) {
      if (!sep->is_array() || sep->arr().size() != 2 || !sep->arr()[0].is_string() || !sep->arr()[1].is_string())
        fail(line, "tojson: separators must be a pair of strings");
      st.custom_separators = true;
      st.item_sep = sep->arr()[0].str();
      st.key_sep = sep->arr()[1].str();
    }
    st.sort_keys = arg_bool(a, 3, "sort_keys", false);
    try {
      return Value(dumps(v, st));
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.rfind("chat template: ", 0) == 0) throw;  // the budget or a size cap: already a template error
      fail(line, "tojson: " + what);
    }
  }
  if (f == "length" || f == "count") return Value(py_len(v, line));
  if (f == "upper") return Value(map_case(v.to_str(), true));
  if (f == "lower") return Value(map_case(v.to_str(), false));
  if (f == "capitalize") return Value(py_capitalize(v.to_str()));
  if (f == "title") return Value(py_title(v.to_str()));
  if (f == "string") return Value(v.to_str());
  if (f == "safe") return v;
  if (f == "escape" || f == "e" || f == "forceescape") return Value(html_escape(v.to_str()));
  if (f == "default" || f == "d") {
    const bool boolean = arg_bool(a, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !v.truthy())) {
      const Value* d = arg(a, 0, "default_value");
      return d ? *d : Value("");
    }
    return v;
  }
  if (f == "join") {
    const std::string sep = arg_str(a, 0, "d", "");
    const Value* attr = arg(a, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& e : iterate_value(v, line)) {
      if (!first) append_checked(out, sep, "string", line);
      first = false;
      append_checked(out, (attr && !attr->is_none() ? attribute_path(e, attr->to_str(), line) : e).to_str(), "string", line);
    }
    return Value(out);
  }
  if (f == "items") {
    if (v.is_undefined()) return Value::array();
    if (!v.is_object() || v.is_namespace()) fail(line, "items filter: can only get item pairs from a mapping, not " + v.type_name());
    spend(v.obj().items.size(), line);
    Array out;
    for (const auto& kv : v.obj().items) out.push_back(Value::array({Value(kv.first), kv.second}, true));
    return Value::array(std::move(out));
  }
  if (f == "list") return Value::array(iterate_value(v, line));
  if (f == "first" || f == "last") {
    if (v.is_array()) {  // O(1), as jinja2's first (next(iter)) and last (reversed) are on a list
      if (v.arr().empty()) return Value::undefined("no " + f + " item, sequence was empty");
      return f == "first" ? v.arr().front() : v.arr().back();
    }
    const Array items = iterate_value(v, line);
    if (items.empty()) return Value::undefined("no " + f + " item, sequence was empty");
    return f == "first" ? items.front() : items.back();
  }
  if (f == "reverse") {
    if (v.is_string()) {
      std::vector<uint32_t> cps = to_cps(v.str());
      std::reverse(cps.begin(), cps.end());
      return Value(from_cps(cps, 0, cps.size()));
    }
    Array items = iterate_value(v, line);
    std::reverse(items.begin(), items.end());
    return Value::array(std::move(items));
  }
  if (f == "select" || f == "reject") return select_items(v, a, f == "select", false, line);
  if (f == "selectattr" || f == "rejectattr") return select_items(v, a, f == "selectattr", true, line);
  if (f == "map") {
    Array out;
    if (const Value* attr = a.kwarg("attribute")) {
      const Value* dflt = a.kwarg("default");
      for (const Value& e : iterate_value(v, line)) {
        Value x = attribute_path(e, attr->to_str(), line);
        out.push_back(x.is_undefined() && dflt ? *dflt : x);
      }
      return Value::array(std::move(out));
    }
    if (a.args.empty() || !a.args[0].is_string()) fail(line, "map: needs a filter name or attribute=");
    CallArgs rest;
    rest.args.assign(a.args.begin() + 1, a.args.end());
    rest.kwargs = a.kwargs;
    for (const Value& e : iterate_value(v, line)) out.push_back(call_filter(a.args[0].str(), e, rest, line));
    return Value::array(std::move(out));
  }
  if (f == "attr") return get_attr(v, arg_str(a, 0, "name", ""), line);
  if (f == "replace") {
    return Value(py_replace(v.to_str(), arg_str(a, 0, "old", ""), arg_str(a, 1, "new", ""), arg_int(a, 2, "count", -1)));
  }
  if (f == "int") {
    const Value* d = arg(a, 0, "default");
    const Value dflt = d ? *d : Value(0);
    if (v.is_number()) return v.is_float() ? Value((int64_t)std::trunc(v.as_double())) : Value(v.as_int());
    if (v.is_string()) {
      const std::string s = py_strip(v.str(), nullptr, 3);
      char* end = nullptr;
      const long long i = std::strtoll(s.c_str(), &end, (int)arg_int(a, 1, "base", 10));
      if (!s.empty() && end && *end == 0) return Value((int64_t)i);
      const double d2 = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == 0) return Value((int64_t)std::trunc(d2));
    }
    return dflt;
  }
  if (f == "float") {
    const Value* d = arg(a, 0, "default");
    if (v.is_number()) return Value(v.as_double());
    if (v.is_string()) {
      const std::string s = py_strip(v.str(), nullptr, 3);
      char* end = nullptr;
      const double d2 = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == 0) return Value(d2);
    }
    return d ? *d : Value(0.0);
  }
  if (f == "abs") {
    if (!v.is_number()) fail(line, "bad operand type for abs(): '" + v.type_name() + "'");
    return v.is_float() ? Value(std::fabs(v.as_double())) : Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  if (f == "round") {
    if (!v.is_number()) fail(line, "round: not a number");
    const int64_t prec = arg_int(a, 0, "precision", 0);
    const std::string m = arg_str(a, 1, "method", "common");
    const double scale = std::pow(10.0, (double)prec), x = v.as_double() * scale;
    double r = m == "ceil" ? std::ceil(x) : m == "floor" ? std::floor(x) : std::nearbyint(x);
    return Value(r / scale);
  }
  if (f == "sum") {
    const Value* attr = arg(a, 0, "attribute");
    Value total = arg(a, 1, "start") ? *arg(a, 1, "start") : Value(0);
    for (const Value& e : iterate_value(v, line))
      total = binary_op("+", total, attr && !attr->is_none() ? attribute_path(e, attr->to_str(), line) : e, line);
    return total;
  }
  if (f == "min" || f == "max") {
    const bool cs = arg_bool(a, 0, "case_sensitive", false);
    const Value* attr = arg(a, 1, "attribute");
    const Array items = iterate_value(v, line);
    if (items.empty()) return Value::undefined("no " + f + " item, sequence was empty");
    size_t best = 0;
    auto key = [&](const Value& e) { return sort_key(attr && !attr->is_none() ? attribute_path(e, attr->to_str(), line) : e, cs); };
    for (size_t k = 1; k < items.size(); k++) {
      const int c = py_cmp(key(items[k]), key(items[best]), line);
      if (f == "min" ? c < 0 : c > 0) best = k;
    }
    return items[best];
  }
  if (f == "unique") {
    const bool cs = arg_bool(a, 0, "case_sensitive", false);
    Array out, seen;
    for (const Value& e : iterate_value(v, line)) {
      const Value k = sort_key(e, cs);
      if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return s.equals(k); })) continue;
      seen.push_back(k);
      out.push_back(e);
    }
    return Value::array(std::move(out));
  }
  if (f == "sort" || f == "dictsort") {
    const bool dict = f == "dictsort";
    Array items;
    if (dict) {
      if (!v.is_object()) fail(line, "dictsort: not a mapping");
      spend(v.obj().items.size(), line);
      for (const auto& kv : v.obj().items) items.push_back(Value::array({Value(kv.first), kv.second}, true));
    } else {
      items = iterate_value(v, line);
    }
    const bool reverse = dict ? arg_bool(a, 2, "reverse", false) : arg_bool(a, 0, "reverse", false);
    const bool cs = dict ? arg_bool(a, 0, "case_sensitive", false) : arg_bool(a, 1, "case_sensitive", false);
    const Value* attr = dict ? nullptr : arg(a, 2, "attribute");
    const std::string by = dict ? arg_str(a, 1, "by", "key") : "";
    auto key = [&](const Value& e) {
      if (dict) return sort_key(e.arr()[by == "value" ? 1 : 0], cs);
      return sort_key(attr && !attr->is_none() ? attribute_path(e, attr->to_str(), line) : e, cs);
    };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const int c = py_cmp(key(x), key(y), line);
      return reverse ? c > 0 : c < 0;
    });
    return Value::array(std::move(items));
  }
  if (f == "indent") {
    const Value* w = arg(a, 0, "width");
    const int64_t width = w && !w->is_string() ? std::max<int64_t>(0, w->as_int()) : 4;
    check_size(static_cast<uint64_t>(width), kMaxStringBytes, "indent width", 0);
    const std::string ind = w && w->is_string() ? w->str() : std::string(static_cast<size_t>(width), ' ');
    const bool first = arg_bool(a, 1, "first", false), blank = arg_bool(a, 2, "blank", false);
    const Value lines = py_splitlines(v.to_str() + "\n", false);
    std::string rv;
    auto put = [&](std::string_view text) { append_checked(rv, text, "string", line); };
    if (first) put(ind);
    const Array& ls = lines.arr();
    for (size_t k = 0; k < ls.size(); k++) {
      if (k) put("\n");
      if (k && (blank || !ls[k].str().empty())) put(ind);
      put(ls[k].str());
    }
    return Value(rv);
  }
  if (f == "wordcount") return Value((int64_t)py_split(v.to_str(), nullptr, -1, false).arr().size());
  fail(line, "unsupported filter '" + f + "'");
}

// Spends the string inputs' size before the filter runs and a string result's after (jinja_internal.h).
Value call_filter(const std::string& name, const Value& v, const CallArgs& a, int line) {
  const CallLine at(line);
  spend(text_steps(v) + args_steps(a), line);
  Value out = run_filter(name, v, a, line);
  spend_result(out, line);
  return out;
}

// ------------------------------------------------------------------------------------------------
// Tests

bool call_test(const std::string& name, const Value& v, const CallArgs& a, int line) {
  const CallLine at(line);
  spend(text_steps(v) + args_steps(a), line);
  const std::string& t = name;
  auto other = [&]() -> const Value& {
    if (a.args.empty()) fail(line, "test '" + t + "' needs an argument");
    return a.args[0];
  };
  if (t == "defined") return !v.is_undefined();
  if (t == "undefined") return v.is_undefined();
  if (t == "none") return v.is_none();
  if (t == "boolean") return v.is_bool();
  if (t == "true") return v.is_bool() && v.as_bool();
  if (t == "false") return v.is_bool() && !v.as_bool();
  if (t == "integer") return v.is_int();
  if (t == "float") return v.is_float();
  if (t == "number") return v.is_number();
  if (t == "string") return v.is_string();
  if (t == "mapping") return v.is_object() && !v.is_namespace();
  if (t == "iterable") return v.is_string() || v.is_array() || (v.is_object() && !v.is_namespace()) || v.is_undefined();
  if (t == "sequence") return v.is_string() || v.is_array() || (v.is_object() && !v.is_namespace()) || v.is_undefined();
  if (t == "callable") return v.is_function();
  if (t == "sameas") {
    const Value& o = other();
    if (v.is_none() || o.is_none() || v.is_bool() || o.is_bool()) return v.kind() == o.kind() && v.equals(o);
    return v.equals(o) && v.kind() == o.kind();
  }
  if (t == "eq" || t == "equalto" || t == "==") return v.equals(other());
  if (t == "ne" || t == "!=") return !v.equals(other());
  if (t == "lt" || t == "lessthan" || t == "<") return compare_op("<", v, other(), line);
  if (t == "le" || t == "<=") return compare_op("<=", v, other(), line);
  if (t == "gt" || t == "greaterthan" || t == ">") return compare_op(">", v, other(), line);
  if (t == "ge" || t == ">=") return compare_op(">=", v, other(), line);
  if (t == "in") return compare_op("in", v, other(), line);
  if (t == "odd" || t == "even") {
    if (!v.is_number() || v.is_float()) fail(line, "test '" + t + "' needs an integer");
    const bool odd = (v.as_int() % 2) != 0;
    return t == "odd" ? odd : !odd;
  }
  if (t == "divisibleby") {
    const Value& o = other();
    if (!v.is_number() || !o.is_number() || o.as_double() == 0) fail(line, "divisibleby: bad operands");
    return binary_op("%", v, o, line).as_double() == 0;
  }
  if (t == "lower" || t == "upper") {
    const std::string s = v.to_str();
    return s == map_case(s, t == "upper");
  }
  fail(line, "unsupported test '" + t + "'");
}

// ------------------------------------------------------------------------------------------------
// Globals

void add_globals(std::unordered_map<std::string, Value>& vars) {
  vars["range"] = Value::function("range", [](const CallArgs& a) {
    if (a.args.empty() || a.args.size() > 3) fail(0, "range expected 1 to 3 arguments");
    for (const Value& x : a.args)
      if (!x.is_number() || x.is_float()) fail(0, "range: arguments must be integers");
    int64_t start = 0, stop, step = 1;
    if (a.args.size() == 1) stop = a.args[0].as_int();
    else start = a.args[0].as_int(), stop = a.args[1].as_int();
    if (a.args.size() == 3) step = a.args[2].as_int();
    if (step == 0) fail(0, "range() arg 3 must not be zero");
    Array out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      out.emplace_back(k);
      if (out.size() > kMaxArrayItems) fail(0, "range too big");
    }
    return Value::array(std::move(out));
  });
  vars["namespace"] = Value::function("namespace", [](const CallArgs& a) {
    Object o;
    for (const Value& x : a.args) {
      if (!x.is_object()) fail(0, "namespace(): positional arguments must be mappings");
      for (const auto& kv : x.obj().items) o.set(kv.first, kv.second);
    }
    for (const auto& kv : a.kwargs) o.set(kv.first, kv.second);
    Value ns = Value::object(std::move(o), true);
    register_namespace(ns, 0);
    return ns;
  });
  vars["dict"] = Value::function("dict", [](const CallArgs& a) {
    Object o;
    for (const Value& x : a.args) {
      if (!x.is_object()) fail(0, "dict(): positional arguments must be mappings");
      for (const auto& kv : x.obj().items) o.set(kv.first, kv.second);
    }
    for (const auto& kv : a.kwargs) o.set(kv.first, kv.second);
    return Value::object(std::move(o));
  });
  vars["raise_exception"] = Value::function("raise_exception", [](const CallArgs& a) -> Value {
    fail(0, "the template raised an error: " + (a.args.empty() ? std::string() : a.args[0].to_str()));
  });
  vars["strftime_now"] = Value::function("strftime_now", [](const CallArgs& a) {
    if (a.args.empty() || !a.args[0].is_string()) fail(0, "strftime_now() needs a format string");
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, a.args[0].str().c_str(), &tm);
    return Value(std::string(buf, n));
  });
}

}  // namespace kvzap::jinja
