// Shared between jinja.cpp (lexer, parser, evaluator) and jinja_builtins.cpp (operators, filters,
// tests, Python methods, globals). Not part of the public interface.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include "chat/jinja.h"

namespace kvzap::jinja {

// Throws kvzap::Error("chat template: <msg> at line <line>"); line 0 = the line of the call being run.
[[noreturn]] void fail(int line, const std::string& msg);

// Size limits on what a template can build: Python would grow until MemoryError, we refuse with a clear
// error instead (a chat prompt is at most a few MB of text; `'x' * 10**11` must not take the process down).
constexpr size_t kMaxStringBytes = size_t{64} << 20;  // any string value and the rendered output
constexpr size_t kMaxArrayItems = 100000;             // the same bound as range()
// Fails with "... too large" unless n <= limit.
void check_size(size_t n, size_t limit, const char* what, int line);
// Lists and dicts nest at most this deep (Python stops near 1000 with a RecursionError): repr, ==,
// tojson and the destructors recurse once per level and must not run off the stack.
constexpr uint32_t kMaxNesting = 1000;

// Work budget. A render may spend a bounded number of steps (Template::render sets the budget on its
// thread; outside a render nothing is counted). One step is about one node run or evaluated, one list
// or dict item visited, or kBytesPerStep bytes of string visited or built. String built-ins are linear
// in their text, so calls spend their string inputs' size up front (text_steps); lists and dicts are
// spent where they are walked (iterate_value, ==, repr, tojson, methods), never just for being passed,
// so `messages|length` in a loop over messages stays linear. An endless loop, or work exploding
// through shared lists ([[0] * 100000] * 100000 | string), ends in a clear error instead of a hang.
constexpr size_t kBytesPerStep = 8;  // 8 bytes of UTF-8 decoding (upper, slices, isalpha) cost about one node
void spend(uint64_t steps, int line);
uint64_t size_steps(const Value& v);  // shallow: 1 + string bytes / kBytesPerStep, or 1 + list / dict items
uint64_t text_steps(const Value& v);  // size_steps for a string, 1 for anything else
uint64_t args_steps(const CallArgs& a);  // text_steps of every argument
// What a built-in returned: a string over kMaxStringBytes is an error, and its size is spent.
void spend_result(const Value& v, int line);
// out += part, within kMaxStringBytes (`what` names the string in the error) and spending its size.
void append_checked(std::string& out, std::string_view part, const char* what, int line);
// Keeps a namespace() made during the current render alive until the render ends, when its contents
// are dropped: a namespace is the only mutable value, so it can hold itself (ns.x = [ns]) or chain
// without bound (ns.prev.next = n); emptying them all at the end frees cycles and avoids deep destructor
// recursion. Fails past kMaxArrayItems namespaces in one render.
void register_namespace(const Value& ns, int line);

// Sets the line fail(0, ...) reports while a function, filter or test runs (restored on exit).
// (Behind a function, not an extern thread_local: GCC 12's UBSan reports every store through the TLS
// wrapper of an extern thread_local int as a store to a null pointer.)
int& call_line();
struct CallLine {
  int saved;
  explicit CallLine(int line) : saved(call_line()) { call_line() = line; }
  ~CallLine() { call_line() = saved; }
  CallLine(const CallLine&) = delete;
  CallLine& operator=(const CallLine&) = delete;
};

// UTF-8 helpers that never fail: an ill-formed byte counts as one code point U+FFFD.
size_t cp_len(const std::string& s, size_t i);
uint32_t decode_cp(const std::string& s, size_t i);
void append_cp(std::string& out, uint32_t cp);
bool is_space_cp(uint32_t cp);  // Python's str.isspace()

Array iterate_value(const Value& v, int line);  // for-loops and filters: what `for x in v` visits
Value get_attr(const Value& obj, const std::string& name, int line);   // obj.name
Value get_item(const Value& obj, const Value& key, int line);          // obj[key]
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line);
Value binary_op(const std::string& op, const Value& l, const Value& r, int line);  // + - * / // % **
bool compare_op(const std::string& op, const Value& l, const Value& r, int line);  // == != < > <= >= in, not in
Value invoke(const Value& fn, const CallArgs& args, int line);
Value call_filter(const std::string& name, const Value& v, const CallArgs& args, int line);
bool call_test(const std::string& name, const Value& v, const CallArgs& args, int line);
void add_globals(std::unordered_map<std::string, Value>& vars);

}  // namespace kvzap::jinja
