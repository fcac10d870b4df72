// Jinja2 subset for chat templates: lexer (with HF's whitespace settings), recursive-descent parser
// following jinja2's grammar and precedence, and a tree-walking evaluator. Built-in filters, tests and
// Python methods are in jinja_builtins.cpp.
#include "chat/jinja.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_map>

#include "chat/jinja_internal.h"
#include "kvzap/error.h"

namespace kvzap::jinja {

int& call_line() {
  thread_local int line = 0;  // line of the call being run (for errors raised inside functions)
  return line;
}

[[noreturn]] void fail(int line, const std::string& msg) {
  if (line <= 0) line = call_line();
  throw Error("chat template: " + msg + (line > 0 ? " at line " + std::to_string(line) : ""));
}

void check_size(size_t n, size_t limit, const char* what, int line) {
  if (n > limit)
    fail(line, std::string(what) + " too large (" + std::to_string(n) + ", the limit is " + std::to_string(limit) + ")");
}

namespace {
// What the render running on this thread may still spend, and the namespaces it made. limit == 0:
// no render is running, nothing is counted.
struct RenderState {
  uint64_t limit = 0, left = 0;
  std::vector<Value>* namespaces = nullptr;
};
// (Behind a function for the reason call_line() is.)
RenderState& render_state() {
  thread_local RenderState state;
  return state;
}
}  // namespace

void spend(uint64_t steps, int line) {
  RenderState& st = render_state();
  if (st.limit == 0) return;
  if (steps <= st.left) {
    st.left -= steps;
    return;
  }
  st.left = 0;
  fail(line, "the template did more than " + std::to_string(st.limit) +
                 " steps of work (a loop that does not end, or values built too large)");
}

uint64_t size_steps(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::String: return 1 + v.str().size() / kBytesPerStep;
    case Value::Kind::Array: return 1 + v.arr().size();
    case Value::Kind::Object: return 1 + v.obj().items.size();
    default: return 1;
  }
}

uint64_t text_steps(const Value& v) { return v.is_string() ? size_steps(v) : 1; }

uint64_t args_steps(const CallArgs& a) {
  uint64_t n = 0;
  for (const Value& v : a.args) n += text_steps(v);
  for (const auto& kv : a.kwargs) n += text_steps(kv.second);
  return n;
}

void spend_result(const Value& v, int line) {
  if (!v.is_string()) return;
  check_size(v.str().size(), kMaxStringBytes, "string", line);
  spend(size_steps(v), line);
}

void append_checked(std::string& out, std::string_view part, const char* what, int line) {
  check_size(out.size() + part.size(), kMaxStringBytes, what, line);
  spend(part.size() / kBytesPerStep, line);
  out += part;
}

void register_namespace(const Value& ns, int line) {
  std::vector<Value>* all = render_state().namespaces;
  if (!all) return;
  if (all->size() >= kMaxArrayItems) fail(line, "too many namespaces (the limit is " + std::to_string(kMaxArrayItems) + ")");
  all->push_back(ns);
}

Value invoke(const Value& fn, const CallArgs& args, int line) {
  const CallLine at(line);
  spend(1 + args_steps(args), line);
  Value out = fn.fn()(args);
  spend_result(out, line);
  return out;
}

namespace {

// ------------------------------------------------------------------------------------------------
// Lexer

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type = Tok::Eof;
  std::string text;  // Text data, name, operator, or the decoded string literal
  int64_t i = 0;
  double f = 0;
  int line = 1;
};

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's str.rstrip() / the regex \s* after "-%}".
std::string rstrip_ws(const std::string& s) {
  size_t e = s.size();
  while (e > 0) {
    size_t b = e - 1;
    while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
    if (!is_space_cp(decode_cp(s, b))) break;
    e = b;
  }
  return s.substr(0, e);
}

size_t skip_ws(const std::string& s, size_t i) {
  while (i < s.size()) {
    const uint32_t cp = decode_cp(s, i);
    if (!is_space_cp(cp)) break;
    i += cp_len(s, i);
  }
  return i;
}

std::string decode_string_literal(const std::string& body, int line) {
  // Python's unicode-escape decoding of the literal (what jinja2's lexer does); an unknown escape
  // keeps its backslash.
  std::string out;
  for (size_t i = 0; i < body.size(); i++) {
    const char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      continue;
    }
    const char e = body[++i];
    auto hex = [&](size_t n) {
      uint32_t v = 0;
      for (size_t k = 1; k <= n; k++) {
        if (i + k >= body.size() || !std::isxdigit((unsigned char)body[i + k])) fail(line, "bad escape in a string literal");
        const char h = body[i + k];
        v = v * 16 + (uint32_t)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      i += n;
      return v;
    };
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\n': break;  // line continuation
      case 'x': append_cp(out, hex(2)); break;
      case 'u': append_cp(out, hex(4)); break;
      case 'U': append_cp(out, hex(8)); break;
      default:
        if (e >= '0' && e <= '7') {
          uint32_t v = (uint32_t)(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; k++)
            v = v * 8 + (uint32_t)(body[++i] - '0');
          append_cp(out, v);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

std::vector<Token> lex(const std::string& source) {
  // Newlines normalised to "\n", one trailing newline dropped (keep_trailing_newline off).
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); i++) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') i++;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();

  std::vector<Token> out;
  int line = 1;
  bool line_starting = true;
  size_t pos = 0;
  const size_t n = src.size();
  auto count_lines = [&](size_t a, size_t b) {
    for (size_t k = a; k < b; k++)
      if (src[k] == '\n') line++;
  };
  while (pos < n) {
    size_t at = pos;
    while (true) {
      at = src.find('{', at);
      if (at == std::string::npos || at + 1 >= n) {
        at = std::string::npos;
        break;
      }
      const char k = src[at + 1];
      if (k == '{' || k == '%' || k == '#') break;
      at++;
    }
    if (at == std::string::npos) {
      out.push_back({Tok::Text, src.substr(pos), 0, 0, line});
      break;
    }
    const char kind = src[at + 1];
    const char mod = at + 2 < n && (src[at + 2] == '-' || src[at + 2] == '+') ? src[at + 2] : 0;
    std::string text = src.substr(pos, at - pos);
    if (mod == '-') {
      text = rstrip_ws(text);
    } else if (mod != '+' && kind != '{') {  // lstrip_blocks
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting) {
        if (text.find_first_not_of(" \t", l_pos) == std::string::npos) text.resize(l_pos);
      }
    }
    const int text_line = line;
    count_lines(pos, at);
    if (!text.empty()) out.push_back({Tok::Text, text, 0, 0, text_line});
    size_t p = at + 2 + (mod ? 1 : 0);
    const int tag_line = line;

    if (kind == '#') {
      size_t e = p;
      while (true) {
        e = src.find("#}", e);
        if (e == std::string::npos) fail(tag_line, "unclosed comment");
        break;
      }
      const bool minus = e > p && src[e - 1] == '-';
      const bool plus = e > p && src[e - 1] == '+';
      count_lines(p, e);
      size_t after = e + 2;
      if (minus) {
        const size_t s = skip_ws(src, after);
        count_lines(after, s);
        after = s;
      } else if (!plus && after < n && src[after] == '\n') {
        after++;
        line++;
      }
      line_starting = after > 0 && src[after - 1] == '\n';
      pos = after;
      continue;
    }

    const bool block = kind == '%';
    out.push_back({block ? Tok::BlockBegin : Tok::VarBegin, "", 0, 0, tag_line});
    const std::string end = block ? "%}" : "}}";
    int depth = 0;
    while (true) {
      // whitespace
      while (p < n && is_ascii_space(src[p])) {
        if (src[p] == '\n') line++;
        p++;
      }
      if (p >= n) fail(tag_line, std::string("unclosed ") + (block ? "'{%'" : "'{{'"));
      if (depth == 0) {
        size_t end_at = std::string::npos;
        char end_mod = 0;
        if (src.compare(p, 1 + end.size(), "-" + end) == 0) end_at = p + 1, end_mod = '-';
        else if (block && src.compare(p, 3, "+%}") == 0) end_at = p + 1, end_mod = '+';
        else if (src.compare(p, end.size(), end) == 0) end_at = p;
        if (end_at != std::string::npos) {
          size_t after = end_at + 2;
          if (end_mod == '-') {
            const size_t s = skip_ws(src, after);
            count_lines(after, s);
            after = s;
          } else if (block && end_mod != '+' && after < n && src[after] == '\n') {  // trim_blocks
            after++;
            line++;
          }
          out.push_back({block ? Tok::BlockEnd : Tok::VarEnd, "", 0, 0, line});
          line_starting = src[after - 1] == '\n';
          pos = after;
          break;
        }
      }
      const char c = src[p];
      Token t;
      t.line = line;
      if (std::isalpha((unsigned char)c) || c == '_') {
        size_t e = p;
        while (e < n && (std::isalnum((unsigned char)src[e]) || src[e] == '_')) e++;
        t.type = Tok::Name;
        t.text = src.substr(p, e - p);
        p = e;
      } else if (std::isdigit((unsigned char)c)) {
        size_t e = p;
        auto digits = [&]() {
          while (e < n && (std::isdigit((unsigned char)src[e]) || (src[e] == '_' && e + 1 < n && std::isdigit((unsigned char)src[e + 1]))))
            e++;
        };
        digits();
        bool is_float = false;
        if (e + 1 < n && src[e] == '.' && std::isdigit((unsigned char)src[e + 1])) {
          is_float = true;
          e++;
          digits();
        }
        if (e < n && (src[e] == 'e' || src[e] == 'E')) {
          size_t q = e + 1;
          if (q < n && (src[q] == '+' || src[q] == '-')) q++;
          if (q < n && std::isdigit((unsigned char)src[q])) {
            is_float = true;
            e = q;
            digits();
          }
        }
        std::string num;
        for (size_t k = p; k < e; k++)
          if (src[k] != '_') num += src[k];
        if (is_float) {
          t.type = Tok::Float;
          t.f = std::strtod(num.c_str(), nullptr);
        } else {
          t.type = Tok::Int;
          t.i = std::strtoll(num.c_str(), nullptr, 10);
        }
        t.text = num;
        p = e;
      } else if (c == '\'' || c == '"') {
        size_t e = p + 1;
        while (e < n && src[e] != c) {
          if (src[e] == '\\') e++;
          e++;
        }
        if (e >= n) fail(line, "unterminated string literal");
        const std::string body = src.substr(p + 1, e - p - 1);
        t.type = Tok::String;
        t.text = decode_string_literal(body, line);
        count_lines(p, e);
        p = e + 1;
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                           "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
        const char* op = nullptr;
        for (const char* o : kOps)
          if (src.compare(p, std::strlen(o), o) == 0) {
            op = o;
            break;
          }
        if (!op) fail(line, std::string("unexpected character '") + c + "'");
        t.type = Tok::Op;
        t.text = op;
        p += t.text.size();
        if (t.text == "(" || t.text == "[" || t.text == "{") depth++;
        if (t.text == ")" || t.text == "]" || t.text == "}") {
          if (depth == 0) fail(line, "unexpected '" + t.text + "'");
          depth--;
        }
      }
      out.push_back(std::move(t));
    }
  }
  Token eof;
  eof.line = line;
  out.push_back(eof);
  return out;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// AST

enum class NK {
  // expressions
  Literal, Name, List, Tuple, Dict, Attr, Item, Slice, Call, Filter, Test, Neg, Pos, Not, And, Or, Binary,
  Concat, Compare, Cond,
  // statements
  Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, FilterBlock, Body
};

struct Node {
  NK kind;
  int line = 0;
  std::string name;                 // name, attribute, filter, test, operator, tag
  Value literal;
  std::vector<std::unique_ptr<Node>> a;  // operands / arguments (may hold nullptr: slice bounds, cond else)
  std::vector<std::pair<std::string, std::unique_ptr<Node>>> kwargs;
  std::vector<std::string> ops;     // Compare operators
  std::vector<std::string> targets; // For / Set names; Set namespace attribute in name
  std::vector<std::vector<std::unique_ptr<Node>>> bodies;  // If: one per branch (+ else); For: body, else
  bool negate = false;              // Test: "is not"
  bool has_else = false;
  int depth = 1;                    // expressions: levels of nodes down to the deepest leaf (Parser::link)
  Node(NK k, int l) : kind(k), line(l) {}
};
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

namespace {

NodePtr make(NK k, int line) { return std::make_unique<Node>(k, line); }

// ------------------------------------------------------------------------------------------------
// Parser

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  // Brackets, unary operators, `not`, inline ifs and block tags recurse through the parser (and later
  // the renderer): at most kMaxNesting levels, about what jinja2 manages under Python's recursion limit.
  // Chains built in a loop (a + b + ..., x.a.b..., x|f|g...) do not recurse here but make the tree as
  // deep, which the renderer and the destructors then recurse through: every expression node is at most
  // kMaxExpressionDepth levels deep (link()).
  static constexpr int kMaxNesting = 100;
  static constexpr int kMaxExpressionDepth = 500;

  NodePtr parse_template() {
    auto root = make(NK::Body, 1);
    root->bodies.emplace_back();
    std::string end;
    parse_body(root->bodies[0], {}, end);
    if (cur().type != Tok::Eof) fail(cur().line, "unexpected content");
    return root;
  }

 private:
  std::vector<Token> t_;
  size_t i_ = 0;
  int nesting_ = 0;

  class Nest {
   public:
    Nest(Parser& p, int line) : p_(p) {
      if (++p_.nesting_ > kMaxNesting)
        fail(line, "template nested too deeply (more than " + std::to_string(kMaxNesting) + " levels of brackets, operators or blocks)");
    }
    ~Nest() { p_.nesting_--; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Parser& p_;
  };

  // Sets n's depth from its operands and checks it; every expression node made from others passes here.
  NodePtr link(NodePtr n) {
    int d = 0;
    for (const NodePtr& c : n->a)
      if (c) d = std::max(d, c->depth);
    for (const auto& kv : n->kwargs) d = std::max(d, kv.second->depth);
    n->depth = d + 1;
    if (n->depth > kMaxExpressionDepth)
      fail(n->line, "expression nested too deeply (more than " + std::to_string(kMaxExpressionDepth) + " levels)");
    return n;
  }

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  Token next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case Tok::Eof: return "end of template";
      case Tok::BlockEnd: return "'%}'";
      case Tok::VarEnd: return "'}}'";
      case Tok::Text: return "text";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(cur().line, std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail(cur().line, "expected a name, got " + describe(cur()));
    return next().text;
  }
  void expect(Tok type) {
    if (cur().type != type) {
      const char* what = type == Tok::BlockEnd ? "'%}'" : type == Tok::VarEnd ? "'}}'" : "token";
      fail(cur().line, std::string("expected ") + what + ", got " + describe(cur()));
    }
    next();
  }

  // Parses nodes until a block tag whose name is in `ends` (consumed up to and including the name,
  // reported in `which`) or the end of the template (only when `ends` is empty).
  void parse_body(NodeList& body, const std::set<std::string>& ends, std::string& which) {
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (!ends.empty()) {
          std::string list;
          for (const auto& e : ends) list += (list.empty() ? "'" : " or '") + e + "'";
          fail(t.line, "missing " + list);
        }
        return;
      }
      if (t.type == Tok::Text) {
        auto n = make(NK::Text, t.line);
        n->literal = Value(t.text);
        body.push_back(std::move(n));
        next();
      } else if (t.type == Tok::VarBegin) {
        next();
        auto n = make(NK::Output, t.line);
        n->a.push_back(parse_tuple(true));
        expect(Tok::VarEnd);
        body.push_back(std::move(n));
      } else if (t.type == Tok::BlockBegin) {
        const Token& tag = peek();
        if (tag.type != Tok::Name) fail(tag.line, "expected a tag name after '{%'");
        if (ends.count(tag.text)) {
          next();
          which = next().text;
          return;
        }
        next();
        body.push_back(parse_statement());
      } else {
        fail(t.line, "unexpected " + describe(t));
      }
    }
  }

  NodePtr parse_statement() {
    const Token tag = next();
    const Nest nest(*this, tag.line);
    const std::string& k = tag.text;
    if (k == "if") return parse_if(tag.line);
    if (k == "for") return parse_for(tag.line);
    if (k == "set") return parse_set(tag.line);
    if (k == "macro") return parse_macro(tag.line);
    if (k == "break" || k == "continue") {
      expect(Tok::BlockEnd);
      return make(k == "break" ? NK::Break : NK::Continue, tag.line);
    }
    if (k == "generation") {  // transformers' AssistantTracker tag: renders its body unchanged
      expect(Tok::BlockEnd);
      auto n = make(NK::Body, tag.line);
      n->bodies.emplace_back();
      std::string which;
      parse_body(n->bodies[0], {"endgeneration"}, which);
      expect(Tok::BlockEnd);
      return n;
    }
    if (k == "filter") {
      auto n = make(NK::FilterBlock, tag.line);
      n->a.push_back(nullptr);
      n = parse_filter(std::move(n));
      expect(Tok::BlockEnd);
      n->bodies.emplace_back();
      std::string which;
      parse_body(n->bodies[0], {"endfilter"}, which);
      expect(Tok::BlockEnd);
      return n;
    }
    fail(tag.line, "unsupported tag '" + k + "'");
  }

  NodePtr parse_if(int line) {
    auto n = make(NK::If, line);
    while (true) {
      n->a.push_back(parse_tuple(true));
      expect(Tok::BlockEnd);
      n->bodies.emplace_back();
      std::string which;
      parse_body(n->bodies.back(), {"elif", "else", "endif"}, which);
      if (which == "elif") continue;
      if (which == "else") {
        expect(Tok::BlockEnd);
        n->bodies.emplace_back();
        n->has_else = true;
        parse_body(n->bodies.back(), {"endif"}, which);
      }
      expect(Tok::BlockEnd);
      return n;
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    do {
      names.push_back(expect_name());
    } while (skip_op(","));
    if (paren) expect_op(")");
    return names;
  }

  NodePtr parse_for(int line) {
    auto n = make(NK::For, line);
    n->targets = parse_targets();
    if (!skip_name("in")) fail(cur().line, "expected 'in' in a for loop, got " + describe(cur()));
    n->a.push_back(parse_tuple(false));
    n->a.push_back(skip_name("if") ? parse_expression(true) : nullptr);
    if (is_name("recursive")) fail(cur().line, "unsupported construct 'recursive' loop");
    expect(Tok::BlockEnd);
    n->bodies.emplace_back();
    std::string which;
    parse_body(n->bodies[0], {"else", "endfor"}, which);
    if (which == "else") {
      expect(Tok::BlockEnd);
      n->bodies.emplace_back();
      n->has_else = true;
      parse_body(n->bodies[1], {"endfor"}, which);
    }
    expect(Tok::BlockEnd);
    return n;
  }

  NodePtr parse_set(int line) {
    std::string first = expect_name();
    if (skip_op(".")) {  // namespace attribute
      auto n = make(NK::Set, line);
      n->targets = {first};
      n->name = expect_name();
      expect_op("=");
      n->a.push_back(parse_tuple(true));
      expect(Tok::BlockEnd);
      return n;
    }
    std::vector<std::string> names = {first};
    while (skip_op(",")) names.push_back(expect_name());
    if (skip_op("=")) {
      auto n = make(NK::Set, line);
      n->targets = names;
      n->a.push_back(parse_tuple(true));
      expect(Tok::BlockEnd);
      return n;
    }
    if (names.size() != 1) fail(line, "expected '=' in a set statement");
    auto n = make(NK::SetBlock, line);
    n->targets = names;
    if (is_op("|")) fail(cur().line, "unsupported construct: filter on a block set");
    expect(Tok::BlockEnd);
    n->bodies.emplace_back();
    std::string which;
    parse_body(n->bodies[0], {"endset"}, which);
    expect(Tok::BlockEnd);
    return n;
  }

  NodePtr parse_macro(int line) {
    auto n = make(NK::Macro, line);
    n->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      if (!n->targets.empty()) expect_op(",");
      if (is_op(")")) break;
      const std::string p = expect_name();
      n->targets.push_back(p);
      n->a.push_back(skip_op("=") ? parse_expression(true) : nullptr);
    }
    expect_op(")");
    expect(Tok::BlockEnd);
    n->bodies.emplace_back();
    std::string which;
    parse_body(n->bodies[0], {"endmacro"}, which);
    if (cur().type == Tok::Name && cur().text == n->name) next();
    expect(Tok::BlockEnd);
    return n;
  }

  // ---- expressions (jinja2's precedence) ----

  NodePtr parse_tuple(bool with_condexpr, bool explicit_parens = false) {
    const int line = cur().line;
    std::vector<NodePtr> items;
    bool saw_comma = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        saw_comma = true;
      }
      if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || is_op(")") ||
          (!items.empty() && cur().type == Tok::Name && (cur().text == "if" || cur().text == "in")))
        break;
      items.push_back(with_condexpr ? parse_expression(true) : parse_or());
    }
    if (!saw_comma) {
      if (items.size() == 1) return std::move(items[0]);
      if (!explicit_parens) fail(line, "expected an expression, got " + describe(cur()));
    }
    auto n = make(NK::Tuple, line);
    n->a = std::move(items);
    return link(std::move(n));
  }

  NodePtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  NodePtr parse_condexpr() {
    NodePtr e1 = parse_or();
    while (is_name("if")) {
      const int line = next().line;
      NodePtr cond = parse_or();
      NodePtr e3;
      if (skip_name("else")) {
        const Nest nest(*this, line);
        e3 = parse_condexpr();
      }
      auto n = make(NK::Cond, line);
      n->a.push_back(std::move(e1));
      n->a.push_back(std::move(cond));
      n->a.push_back(std::move(e3));
      e1 = link(std::move(n));
    }
    return e1;
  }

  NodePtr parse_or() {
    NodePtr l = parse_and();
    while (is_name("or")) {
      auto n = make(NK::Or, next().line);
      n->a.push_back(std::move(l));
      n->a.push_back(parse_and());
      l = link(std::move(n));
    }
    return l;
  }

  NodePtr parse_and() {
    NodePtr l = parse_not();
    while (is_name("and")) {
      auto n = make(NK::And, next().line);
      n->a.push_back(std::move(l));
      n->a.push_back(parse_not());
      l = link(std::move(n));
    }
    return l;
  }

  NodePtr parse_not() {
    if (is_name("not")) {
      const Nest nest(*this, cur().line);
      auto n = make(NK::Not, next().line);
      n->a.push_back(parse_not());
      return link(std::move(n));
    }
    return parse_compare();
  }

  NodePtr parse_compare() {
    const int line = cur().line;
    NodePtr first = parse_math1();
    NodePtr n;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" || cur().text == "<=" ||
           cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!n) {
        n = make(NK::Compare, line);
        n->a.push_back(std::move(first));
      }
      n->ops.push_back(op);
      n->a.push_back(parse_math1());
    }
    return n ? link(std::move(n)) : std::move(first);
  }

  NodePtr binary(const std::string& op, NodePtr l, NodePtr r, int line) {
    auto n = make(NK::Binary, line);
    n->name = op;
    n->a.push_back(std::move(l));
    n->a.push_back(std::move(r));
    return link(std::move(n));
  }

  NodePtr parse_math1() {
    NodePtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token op = next();
      l = binary(op.text, std::move(l), parse_concat(), op.line);
    }
    return l;
  }

  NodePtr parse_concat() {
    NodePtr l = parse_math2();
    if (!is_op("~")) return l;
    auto n = make(NK::Concat, cur().line);
    n->a.push_back(std::move(l));
    while (skip_op("~")) n->a.push_back(parse_math2());
    return link(std::move(n));
  }

  NodePtr parse_math2() {
    NodePtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token op = next();
      l = binary(op.text, std::move(l), parse_pow(), op.line);
    }
    return l;
  }

  NodePtr parse_pow() {
    NodePtr l = parse_unary(true);
    while (is_op("**")) {
      const Token op = next();
      l = binary("**", std::move(l), parse_unary(true), op.line);
    }
    return l;
  }

  NodePtr parse_unary(bool with_filter) {
    const Nest nest(*this, cur().line);
    NodePtr node;
    if (is_op("-") || is_op("+")) {
      const Token op = next();
      node = make(op.text == "-" ? NK::Neg : NK::Pos, op.line);
      node->a.push_back(parse_unary(false));
      node = link(std::move(node));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  NodePtr parse_primary() {
    const Token t = cur();
    if (t.type == Tok::Name) {
      next();
      auto n = make(NK::Literal, t.line);
      if (t.text == "true" || t.text == "True") n->literal = Value(true);
      else if (t.text == "false" || t.text == "False") n->literal = Value(false);
      else if (t.text == "none" || t.text == "None") n->literal = Value::none();
      else {
        n->kind = NK::Name;
        n->name = t.text;
      }
      return n;
    }
    if (t.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += next().text;
      auto n = make(NK::Literal, t.line);
      n->literal = Value(s);
      return n;
    }
    if (t.type == Tok::Int || t.type == Tok::Float) {
      next();
      auto n = make(NK::Literal, t.line);
      n->literal = t.type == Tok::Int ? Value(t.i) : Value(t.f);
      return n;
    }
    if (t.type == Tok::Op && t.text == "(") {
      next();
      NodePtr e = parse_tuple(true, true);
      expect_op(")");
      return e;
    }
    if (t.type == Tok::Op && t.text == "[") {
      next();
      auto n = make(NK::List, t.line);
      while (!is_op("]")) {
        if (!n->a.empty()) expect_op(",");
        if (is_op("]")) break;
        n->a.push_back(parse_expression(true));
      }
      expect_op("]");
      return link(std::move(n));
    }
    if (t.type == Tok::Op && t.text == "{") {
      next();
      auto n = make(NK::Dict, t.line);
      while (!is_op("}")) {
        if (!n->a.empty()) expect_op(",");
        if (is_op("}")) break;
        n->a.push_back(parse_expression(true));
        expect_op(":");
        n->a.push_back(parse_expression(true));
      }
      expect_op("}");
      return link(std::move(n));
    }
    fail(t.line, "unexpected " + describe(t));
  }

  NodePtr parse_postfix(NodePtr node) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        if (cur().type == Tok::Int) {
          auto n = make(NK::Item, line);
          n->a.push_back(std::move(node));
          auto idx = make(NK::Literal, line);
          idx->literal = Value(next().i);
          n->a.push_back(std::move(idx));
          node = link(std::move(n));
        } else {
          auto n = make(NK::Attr, line);
          n->name = expect_name();
          n->a.push_back(std::move(node));
          node = link(std::move(n));
        }
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  NodePtr parse_subscript(NodePtr node) {
    const int line = next().line;  // '['
    NodePtr parts[3];
    bool slice = false;
    int k = 0;
    while (!is_op("]")) {
      if (is_op(":")) {
        next();
        slice = true;
        if (++k > 2) fail(line, "bad slice");
        continue;
      }
      if (parts[k]) fail(line, "bad subscript");
      parts[k] = parse_expression(true);
      if (!slice && is_op(",")) fail(line, "unsupported construct: tuple subscript");
    }
    expect_op("]");
    if (!slice) {
      if (!parts[0]) fail(line, "empty subscript");
      auto n = make(NK::Item, line);
      n->a.push_back(std::move(node));
      n->a.push_back(std::move(parts[0]));
      return link(std::move(n));
    }
    auto n = make(NK::Slice, line);
    n->a.push_back(std::move(node));
    for (auto& p : parts) n->a.push_back(std::move(p));
    return link(std::move(n));
  }

  void parse_call_args(Node& n) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail(cur().line, "unsupported construct: *args / **kwargs in a call");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        const std::string key = next().text;
        next();
        n.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!n.kwargs.empty()) fail(cur().line, "positional argument after a keyword argument");
        n.a.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  NodePtr parse_call(NodePtr callee) {
    auto n = make(NK::Call, cur().line);
    n->a.push_back(std::move(callee));
    parse_call_args(*n);
    return link(std::move(n));
  }

  NodePtr parse_filter(NodePtr n) {
    n->name = expect_name();
    while (is_op(".")) {
      next();
      n->name += "." + expect_name();
    }
    if (is_op("(")) parse_call_args(*n);
    return n;
  }

  NodePtr parse_filter_expr(NodePtr node) {
    while (true) {
      if (is_op("|")) {
        auto n = make(NK::Filter, next().line);
        n->a.push_back(std::move(node));
        node = link(parse_filter(std::move(n)));
      } else if (is_name("is")) {
        auto n = make(NK::Test, next().line);
        n->negate = skip_name("not");
        n->name = expect_name();
        n->a.push_back(std::move(node));
        const Token& c = cur();
        if (is_op("(")) {
          parse_call_args(*n);
        } else if ((c.type == Tok::Name || c.type == Tok::String || c.type == Tok::Int || c.type == Tok::Float ||
                    (c.type == Tok::Op && (c.text == "[" || c.text == "{"))) &&
                   !(c.type == Tok::Name && (c.text == "else" || c.text == "or" || c.text == "and"))) {
          if (c.type == Tok::Name && c.text == "is") fail(c.line, "cannot chain tests with 'is'");
          n->a.push_back(parse_postfix(parse_primary()));
        }
        node = link(std::move(n));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }
};

// ------------------------------------------------------------------------------------------------
// Evaluator

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;
  explicit Scope(Scope* p) : parent(p) {}
  const Value* lookup(const std::string& k) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(k);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { Normal, Break, Continue };

class Renderer {
 public:
  Scope* top = nullptr;  // the template's own scope (macros resolve names from here)
  int depth = 0;         // macro calls in progress
  int frames = 0;        // exec and eval calls in progress
  // A loop iteration or a macro call builds a scope (and the 12-entry loop object): it costs about as
  // much as eight expressions.
  static constexpr uint64_t kStepsPerIteration = 8;
  // The parser bounds one template's nesting, but macros multiply it (200 calls deep, each as deep as
  // the parser allows): the recursion of a render is capped too. Under ASan a level of eval takes about
  // 5 KiB of stack (an 8 MiB stack overflowed near 1,500), so 500 leaves room for repr or tojson of a
  // list nested 1000 deep at the bottom.
  static constexpr int kMaxFrames = 500;

  class Frame {
   public:
    Frame(Renderer& r, int line) : r_(r) {
      if (++r_.frames > kMaxFrames) fail(line, "template rendering nested too deeply (recursive macros?)");
    }
    ~Frame() { r_.frames--; }
    Frame(const Frame&) = delete;
    Frame& operator=(const Frame&) = delete;

   private:
    Renderer& r_;
  };

  Flow exec(const NodeList& body, Scope& sc, std::string& out) {
    for (const NodePtr& n : body) {
      const Flow f = exec(*n, sc, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  // Every write to the rendered output goes through here, so its size cap is checked in one place.
  static void emit(std::string& out, const std::string& text, int line) { append_checked(out, text, "rendered output", line); }

  Flow exec(const Node& n, Scope& sc, std::string& out) {
    const Frame frame(*this, n.line);
    spend(1, n.line);
    switch (n.kind) {
      case NK::Text:
        emit(out, n.literal.str(), n.line);
        return Flow::Normal;
      case NK::Output: {
        emit(out, eval(*n.a[0], sc).to_str(), n.line);
        return Flow::Normal;
      }
      case NK::Body: return exec(n.bodies[0], sc, out);
      case NK::If: {
        for (size_t b = 0; b < n.a.size(); b++)
          if (eval(*n.a[b], sc).truthy()) return exec(n.bodies[b], sc, out);
        if (n.has_else) return exec(n.bodies.back(), sc, out);
        return Flow::Normal;
      }
      case NK::For: return exec_for(n, sc, out);
      case NK::Set: {
        Value v = eval(*n.a[0], sc);
        if (!n.name.empty()) {  // ns.attr = v
          const Value* ns = sc.lookup(n.targets[0]);
          if (!ns || !ns->is_namespace())
            fail(n.line, "cannot assign attribute '" + n.name + "' on '" + n.targets[0] + "' (not a namespace)");
          const_cast<Value*>(ns)->obj().set(n.name, std::move(v));
          return Flow::Normal;
        }
        assign(n.targets, std::move(v), sc, n.line);
        return Flow::Normal;
      }
      case NK::SetBlock: {
        std::string s;
        Scope inner(&sc);
        exec(n.bodies[0], inner, s);
        sc.vars[n.targets[0]] = Value(s);
        return Flow::Normal;
      }
      case NK::FilterBlock: {
        std::string s;
        Scope inner(&sc);
        exec(n.bodies[0], inner, s);
        emit(out, apply_filter(n, Value(s), sc).to_str(), n.line);
        return Flow::Normal;
      }
      case NK::Macro: {
        const Node* def = &n;
        Renderer* self = this;
        sc.vars[n.name] = Value::function(n.name, [self, def](const CallArgs& args) { return self->call_macro(*def, args); });
        return Flow::Normal;
      }
      case NK::Break: return Flow::Break;
      case NK::Continue: return Flow::Continue;
      default: fail(n.line, "internal error: not a statement");
    }
  }

  void assign(const std::vector<std::string>& targets, Value v, Scope& sc, int line) {
    if (targets.size() == 1) {
      sc.vars[targets[0]] = std::move(v);
      return;
    }
    const Array items = iterate_value(v, line);
    if (items.size() != targets.size())
      fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()) + " names");
    for (size_t k = 0; k < targets.size(); k++) sc.vars[targets[k]] = items[k];
  }

  Flow exec_for(const Node& n, Scope& sc, std::string& out) {
    const Value seq = eval(*n.a[0], sc);
    Array items = iterate_value(seq, n.line);
    if (n.a[1]) {  // for x in y if cond: filtered before the loop variables are counted
      Array kept;
      for (Value& it : items) {
        Scope probe(&sc);
        assign(n.targets, it, probe, n.line);
        if (eval(*n.a[1], probe).truthy()) kept.push_back(std::move(it));
      }
      items = std::move(kept);
    }
    const int64_t len = (int64_t)items.size();
    for (int64_t k = 0; k < len; k++) {
      spend(kStepsPerIteration, n.line);
      Scope it(&sc);
      assign(n.targets, items[(size_t)k], it, n.line);
      Object loop;
      loop.set("index0", Value(k));
      loop.set("index", Value(k + 1));
      loop.set("revindex0", Value(len - k - 1));
      loop.set("revindex", Value(len - k));
      loop.set("first", Value(k == 0));
      loop.set("last", Value(k == len - 1));
      loop.set("length", Value(len));
      loop.set("depth", Value(1));
      loop.set("depth0", Value(0));
      loop.set("previtem", k > 0 ? items[(size_t)k - 1] : Value::undefined("there is no previous item"));
      loop.set("nextitem", k + 1 < len ? items[(size_t)k + 1] : Value::undefined("there is no next item"));
      loop.set("cycle", Value::function("loop.cycle", [k](const CallArgs& a) {
                 if (a.args.empty()) fail(0, "loop.cycle() needs at least one argument");
                 return a.args[(size_t)k % a.args.size()];
               }));
      it.vars["loop"] = Value::object(std::move(loop));
      const Flow f = exec(n.bodies[0], it, out);
      if (f == Flow::Break) break;
    }
    if (len == 0 && n.has_else) {
      Scope e(&sc);
      exec(n.bodies[1], e, out);
    }
    return Flow::Normal;
  }

  Value call_macro(const Node& def, const CallArgs& args) {
    if (++depth > 200) fail(def.line, "macro recursion too deep");
    spend(kStepsPerIteration, def.line);
    Scope sc(top);
    size_t k = 0;
    Array extra;
    for (; k < args.args.size(); k++) {
      if (k < def.targets.size()) sc.vars[def.targets[k]] = args.args[k];
      else extra.push_back(args.args[k]);
    }
    Object extra_kw;
    for (const auto& kv : args.kwargs) {
      if (std::find(def.targets.begin(), def.targets.end(), kv.first) != def.targets.end()) sc.vars[kv.first] = kv.second;
      else extra_kw.set(kv.first, kv.second);
    }
    for (size_t p = 0; p < def.targets.size(); p++) {
      if (sc.vars.count(def.targets[p])) continue;
      sc.vars[def.targets[p]] =
          def.a[p] ? eval(*def.a[p], sc) : Value::undefined("missing argument '" + def.targets[p] + "' of macro '" + def.name + "'");
    }
    sc.vars["varargs"] = Value::array(std::move(extra));
    sc.vars["kwargs"] = Value::object(std::move(extra_kw));
    std::string out;
    exec(def.bodies[0], sc, out);
    depth--;
    return Value(out);
  }

  [[noreturn]] static void undefined_error(const Value& v, int line) {
    fail(line, v.hint().empty() ? "undefined value" : v.hint());
  }

  Value eval(const Node& n, Scope& sc) {
    const Frame frame(*this, n.line);
    spend(1, n.line);
    switch (n.kind) {
      case NK::Literal: return n.literal;
      case NK::Name: {
        if (const Value* v = sc.lookup(n.name)) return *v;
        return Value::undefined("'" + n.name + "' is undefined");
      }
      case NK::List:
      case NK::Tuple: {
        Array items;
        for (const NodePtr& e : n.a) items.push_back(eval(*e, sc));
        return Value::array(std::move(items), n.kind == NK::Tuple);
      }
      case NK::Dict: {
        Object o;
        for (size_t k = 0; k + 1 < n.a.size(); k += 2) {
          const Value key = eval(*n.a[k], sc);
          if (!key.is_string()) fail(n.line, "unsupported construct: dict literal with a non-string key");
          o.set(key.str(), eval(*n.a[k + 1], sc));
        }
        return Value::object(std::move(o));
      }
      case NK::Attr: {
        const Value obj = eval(*n.a[0], sc);
        if (obj.is_undefined()) undefined_error(obj, n.line);
        return get_attr(obj, n.name, n.line);
      }
      case NK::Item: {
        const Value obj = eval(*n.a[0], sc);
        if (obj.is_undefined()) undefined_error(obj, n.line);
        return get_item(obj, eval(*n.a[1], sc), n.line);
      }
      case NK::Slice: {
        const Value obj = eval(*n.a[0], sc);
        if (obj.is_undefined()) undefined_error(obj, n.line);
        Value b[3];
        for (int k = 0; k < 3; k++)
          if (n.a[(size_t)k + 1]) b[k] = eval(*n.a[(size_t)k + 1], sc);
        return slice(obj, b[0], b[1], b[2], n.line);
      }
      case NK::Call: {
        const Value callee = eval(*n.a[0], sc);
        if (callee.is_undefined()) undefined_error(callee, n.line);
        if (!callee.is_function()) fail(n.line, "'" + callee.type_name() + "' object is not callable");
        CallArgs args = eval_args(n, sc, 1);
        return invoke(callee, args, n.line);
      }
      case NK::Filter: return apply_filter(n, eval(*n.a[0], sc), sc);
      case NK::Test: {
        const Value v = eval(*n.a[0], sc);
        CallArgs args = eval_args(n, sc, 1);
        const bool r = run_test(n.name, v, args, n.line);
        return Value(n.negate ? !r : r);
      }
      case NK::Neg:
      case NK::Pos: {
        const Value v = eval(*n.a[0], sc);
        if (v.is_undefined()) undefined_error(v, n.line);
        if (!v.is_number()) fail(n.line, "bad operand type for unary " + std::string(n.kind == NK::Neg ? "-" : "+") + ": '" + v.type_name() + "'");
        if (n.kind == NK::Pos) return v.is_float() ? v : Value(v.as_int());
        return v.is_float() ? Value(-v.as_double()) : Value(-v.as_int());
      }
      case NK::Not: return Value(!eval(*n.a[0], sc).truthy());
      case NK::And: {
        Value l = eval(*n.a[0], sc);
        return l.truthy() ? eval(*n.a[1], sc) : l;
      }
      case NK::Or: {
        Value l = eval(*n.a[0], sc);
        return l.truthy() ? l : eval(*n.a[1], sc);
      }
      case NK::Concat: {
        std::string s;
        for (const NodePtr& e : n.a) {
          append_checked(s, eval(*e, sc).to_str(), "string", n.line);
        }
        return Value(s);
      }
      case NK::Binary: return binary_op(n.name, eval(*n.a[0], sc), eval(*n.a[1], sc), n.line);
      case NK::Compare: {
        Value l = eval(*n.a[0], sc);
        for (size_t k = 0; k < n.ops.size(); k++) {
          Value r = eval(*n.a[k + 1], sc);
          if (!compare_op(n.ops[k], l, r, n.line)) return Value(false);
          l = std::move(r);
        }
        return Value(true);
      }
      case NK::Cond: {
        if (eval(*n.a[1], sc).truthy()) return eval(*n.a[0], sc);
        if (n.a[2]) return eval(*n.a[2], sc);
        return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
      }
      default: fail(n.line, "internal error: not an expression");
    }
  }

  CallArgs eval_args(const Node& n, Scope& sc, size_t from) {
    CallArgs args;
    for (size_t k = from; k < n.a.size(); k++) args.args.push_back(n.a[k] ? eval(*n.a[k], sc) : Value());
    for (const auto& kv : n.kwargs) args.kwargs.emplace_back(kv.first, eval(*kv.second, sc));
    return args;
  }

  Value apply_filter(const Node& n, const Value& subject, Scope& sc) {
    return call_filter(n.name, subject, eval_args(n, sc, 1), n.line);
  }

  static bool run_test(const std::string& name, const Value& v, const CallArgs& a, int line) {
    return call_test(name, v, a, line);
  }
};

}  // namespace

// ------------------------------------------------------------------------------------------------
// Template

Template::Template(const std::string& source) {
  Parser p(lex(source));
  root_ = p.parse_template();
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

namespace {
// Steps of input, for the default budget: what the template has to read at least once.
uint64_t input_steps(const Value& v) {
  uint64_t n = size_steps(v);
  if (v.is_array())
    for (const Value& e : v.arr()) n += input_steps(e);
  else if (v.is_object() && !v.is_namespace())
    for (const auto& kv : v.obj().items) n += 1 + kv.first.size() / kBytesPerStep + input_steps(kv.second);
  return n;
}

// Installs a render's budget and namespace list on this thread for its lifetime. On the way out it
// empties every namespace first, then lets them go: nothing a namespace held can then lead to another
// namespace, so cycles are freed and no destructor recurses deeper than kMaxNesting.
class RenderScope {
 public:
  explicit RenderScope(uint64_t max_steps) : saved_(render_state()) {
    render_state() = RenderState{std::max<uint64_t>(max_steps, 1), std::max<uint64_t>(max_steps, 1), &namespaces_};
  }
  ~RenderScope() {
    std::vector<Object> contents;
    contents.reserve(namespaces_.size());
    for (Value& ns : namespaces_) contents.push_back(std::move(ns.obj()));
    render_state() = saved_;
  }
  RenderScope(const RenderScope&) = delete;
  RenderScope& operator=(const RenderScope&) = delete;

 private:
  RenderState saved_;
  std::vector<Value> namespaces_;
};
}  // namespace

uint64_t Template::default_budget(const Object& vars) {
  uint64_t input = 0;
  for (const auto& kv : vars.items) input += input_steps(kv.second);
  uint64_t budget = 0;
  if (__builtin_mul_overflow(input, kRenderStepsPerInputStep, &budget) || __builtin_add_overflow(budget, kRenderBaseSteps, &budget))
    budget = UINT64_MAX;
  return budget;
}

std::string Template::render(const Object& vars) const { return render(vars, default_budget(vars)); }

std::string Template::render(const Object& vars, uint64_t max_steps) const {
  const RenderScope scope(max_steps);
  Scope globals(nullptr);
  add_globals(globals.vars);
  for (const auto& kv : vars.items) globals.vars[kv.first] = kv.second;
  Scope top(&globals);
  Renderer r;
  r.top = &top;
  std::string out;
  r.exec(root_->bodies[0], top, out);
  return out;
}

}  // namespace kvzap::jinja
