#include "eval/report.h"

#include "common/atomic_file.h"

#include <csv.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "eval/ruler.h"
#include "kvzap/error.h"

namespace kvzap::eval {
namespace {

const char* const kColumns[] = {"press", "setting_kind", "setting", "task", "n", "score", "evicted_fraction"};

// Shortest decimal form that reads back to the same double.
std::string shortest(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// One field for the writer. A field that needs no quotes stays bare (so ordinary files read as before);
// any other is quoted by libcsv's csv_write (RFC 4180: surrounding quotes, inner quotes doubled).
// Leading/trailing blanks are quoted too: lenient readers (libcsv's default mode among them) trim them.
std::string csv_field(const std::string& s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t'; };
  if (s.find_first_of(",\"\r\n") == std::string::npos && (s.empty() || (!blank(s.front()) && !blank(s.back()))))
    return s;
  const size_t n = csv_write(nullptr, 0, s.data(), s.size());
  if (n == SIZE_MAX) throw Error("CSV field too large to write");
  std::string out(n, '\0');
  csv_write(out.data(), out.size(), s.data(), s.size());
  return out;
}

// One CSV record and the line it starts on.
struct CsvRecord {
  int64_t line;
  std::vector<std::string> fields;
};

// State shared with libcsv's callbacks. They run inside C code, so no exception may leave them:
// one is kept here and rethrown after the call.
struct CsvState {
  std::vector<CsvRecord> records;
  std::vector<std::string> fields;  // the record being read
  int64_t newlines = 0;             // '\n' inside its (quoted) fields
  int64_t line = 1;                 // the line being fed to the parser
  int64_t records_ended = 0;        // every end of record, blank ones included
  std::exception_ptr error;
};

void on_field(void* data, size_t len, void* state) {
  auto& st = *static_cast<CsvState*>(state);
  try {
    const char* s = static_cast<const char*>(data);
    st.fields.emplace_back(s, len);
    st.newlines += std::count(s, s + len, '\n');
  } catch (...) {
    if (!st.error) st.error = std::current_exception();
  }
}

void on_record(int, void* state) {
  auto& st = *static_cast<CsvState*>(state);
  try {
    ++st.records_ended;
    const bool blank = st.fields.empty() || (st.fields.size() == 1 && st.fields[0].empty());
    // The record ends on st.line; its fields' own line breaks put its start that many lines earlier.
    if (!blank) st.records.push_back({st.line - st.newlines, std::move(st.fields)});
    st.fields.clear();
    st.newlines = 0;
  } catch (...) {
    if (!st.error) st.error = std::current_exception();
  }
}

int no_space(unsigned char) { return 0; }  // keep blanks around unquoted fields, as written

// Splits CSV text into records with libcsv in strict mode (a quote inside an unquoted field, text
// after a closing quote and an unterminated quoted field are errors). The text is fed one line at a
// time so that the callbacks know the line number. Blank lines are skipped.
std::vector<CsvRecord> parse_csv(std::string_view text) {
  csv_parser parser;
  if (csv_init(&parser, CSV_STRICT | CSV_STRICT_FINI) != 0) throw Error("cannot initialise the CSV parser");
  struct Free {
    csv_parser* p;
    ~Free() { csv_free(p); }
  } free_parser{&parser};
  csv_set_space_func(&parser, no_space);
  CsvState st;
  size_t record_end = 0;  // offset just past the line on which the last record ended
  for (size_t pos = 0; pos < text.size();) {
    const size_t nl = text.find('\n', pos);
    const size_t end = nl == std::string_view::npos ? text.size() : nl + 1;
    const int64_t ended = st.records_ended;
    const size_t done = csv_parse(&parser, text.data() + pos, end - pos, on_field, on_record, &st);
    if (st.error) std::rethrow_exception(st.error);
    if (done != end - pos) {
      const std::string where = "CSV line " + std::to_string(st.line) + ": ";
      if (csv_error(&parser) == CSV_EPARSE)
        throw Error(where + "malformed quoting (a quote inside an unquoted field, or text after a closing quote)");
      throw Error(where + csv_strerror(csv_error(&parser)));
    }
    if (st.records_ended != ended) record_end = end;
    pos = end;
    if (nl != std::string_view::npos) ++st.line;
  }
  if (csv_fini(&parser, on_field, on_record, &st) != 0) {
    // The open record starts on the first non-blank line after the last one; the unterminated
    // field, after the line breaks of the fields before it.
    const size_t start = std::min(text.find_first_not_of("\r\n", record_end), text.size());
    const int64_t line = 1 + std::count(text.begin(), text.begin() + start, '\n') + st.newlines;
    throw Error("CSV line " + std::to_string(line) + ": unterminated quoted field");
  }
  if (st.error) std::rethrow_exception(st.error);
  return std::move(st.records);
}

double parse_double(const std::string& s, const char* column, int64_t line) {
  double v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size())
    throw Error("results line " + std::to_string(line) + ": column " + column + " is not a number: '" + s + "'");
  return v;
}

int64_t parse_int(const std::string& s, const char* column, int64_t line) {
  int64_t v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size())
    throw Error("results line " + std::to_string(line) + ": column " + column + " is not an integer: '" + s + "'");
  return v;
}

void validate(const ResultRow& r, int64_t line) {
  const std::string where = "results line " + std::to_string(line) + ": ";
  if (r.press.empty()) throw Error(where + "empty press name");
  if (r.task.empty()) throw Error(where + "empty task name");
  if (r.setting_kind != "ratio" && r.setting_kind != "threshold" && r.setting_kind != "none")
    throw Error(where + "setting_kind must be ratio, threshold or none, not '" + r.setting_kind + "'");
  if (r.n < 0) throw Error(where + "negative sample count");
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read results file " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

ResultRow row_from_json(const nlohmann::json& j, int64_t line) {
  try {
    ResultRow r;
    r.press = j.at("press").get<std::string>();
    r.setting_kind = j.at("setting_kind").get<std::string>();
    r.setting = j.at("setting").get<double>();
    r.task = j.at("task").get<std::string>();
    r.n = j.at("n").get<int64_t>();
    r.score = j.at("score").get<double>();
    r.evicted_fraction = j.at("evicted_fraction").get<double>();
    validate(r, line);
    return r;
  } catch (const nlohmann::json::exception& e) {
    throw Error("results entry " + std::to_string(line) + ": " + e.what());
  }
}

// Column order: RULER's tasks first (in leaderboard order), then any others alphabetically.
std::vector<std::string> task_columns(const std::vector<ResultRow>& rows) {
  std::set<std::string> present;
  for (const auto& r : rows) present.insert(r.task);
  std::vector<std::string> out;
  for (const auto& t : ruler_tasks())
    if (present.erase(t)) out.push_back(t);
  out.insert(out.end(), present.begin(), present.end());
  return out;
}

std::string setting_label(const std::string& kind, double setting) {
  if (kind == "none") return "-";
  return kind + " " + shortest(setting);
}

std::string md_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

// 1, 2 or 5 times a power of ten, at least `raw`.
double nice_step(double raw) {
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw * (1 - 1e-9)) return m * p;
  return 10 * p;
}

std::string file_safe(const std::string& s) {
  std::string out;
  for (char c : s) out += (std::isalnum((unsigned char)c) || c == '_' || c == '-' || c == '.') ? c : '_';
  return out.empty() ? "_" : out;
}

// Tableau-10 colours: distinct and readable on white.
const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

}  // namespace

std::vector<ResultRow> rows_from_task_scores(const std::string& press, const std::string& setting_kind,
                                             double setting, const std::vector<TaskScore>& scores) {
  std::vector<ResultRow> rows;
  for (const auto& t : scores) rows.push_back({press, setting_kind, setting, t.task, t.n, t.score, t.evicted_fraction});
  return rows;
}

std::string results_to_csv(const std::vector<ResultRow>& rows) {
  std::string out = "press,setting_kind,setting,task,n,score,evicted_fraction\n";
  for (const auto& r : rows) {
    out += csv_field(r.press) + ',' + csv_field(r.setting_kind) + ',' + shortest(r.setting) + ',' + csv_field(r.task) +
           ',' + std::to_string(r.n) + ',' + shortest(r.score) + ',' + shortest(r.evicted_fraction) + '\n';
  }
  return out;
}

std::vector<ResultRow> results_from_csv(std::string_view text) {
  const auto records = parse_csv(text);
  if (records.empty()) throw Error("results CSV is empty (expected a header line)");
  int col[7];
  for (int c = 0; c < 7; ++c) {
    const auto& header = records[0].fields;
    auto it = std::find(header.begin(), header.end(), kColumns[c]);
    if (it == header.end()) throw Error(std::string("results CSV header lacks column '") + kColumns[c] + "'");
    col[c] = (int)(it - header.begin());
  }
  std::vector<ResultRow> rows;
  for (size_t i = 1; i < records.size(); ++i) {
    const auto& f = records[i].fields;
    const int64_t line = records[i].line;
    if (f.size() != records[0].fields.size())
      throw Error("results line " + std::to_string(line) + ": expected " + std::to_string(records[0].fields.size()) +
                  " fields, found " + std::to_string(f.size()));
    ResultRow r;
    r.press = f[col[0]];
    r.setting_kind = f[col[1]];
    r.setting = parse_double(f[col[2]], "setting", line);
    r.task = f[col[3]];
    r.n = parse_int(f[col[4]], "n", line);
    r.score = parse_double(f[col[5]], "score", line);
    r.evicted_fraction = parse_double(f[col[6]], "evicted_fraction", line);
    validate(r, line);
    rows.push_back(std::move(r));
  }
  return rows;
}

std::string results_to_json(const std::vector<ResultRow>& rows) {
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const auto& r : rows) {
    nlohmann::ordered_json j;
    j["press"] = r.press;
    j["setting_kind"] = r.setting_kind;
    j["setting"] = r.setting;
    j["task"] = r.task;
    j["n"] = r.n;
    j["score"] = r.score;
    j["evicted_fraction"] = r.evicted_fraction;
    arr.push_back(std::move(j));
  }
  return arr.dump(2) + "\n";
}

std::vector<ResultRow> results_from_json(std::string_view text) {
  std::vector<ResultRow> rows;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return rows;
  try {
    if (text[first] == '[') {
      const auto arr = nlohmann::json::parse(text);
      int64_t i = 0;
      for (const auto& j : arr) rows.push_back(row_from_json(j, ++i));
      return rows;
    }
    int64_t line_no = 0;
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string_view::npos) end = text.size();
      ++line_no;
      const std::string_view line = text.substr(start, end - start);
      if (line.find_first_not_of(" \t\r") != std::string_view::npos)
        rows.push_back(row_from_json(nlohmann::json::parse(line), line_no));
      start = end + 1;
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("malformed results JSON: ") + e.what());
  }
  return rows;
}

std::vector<ResultRow> read_results(const std::string& path) {
  const bool csv = ends_with(path, ".csv");
  if (!csv && !ends_with(path, ".json") && !ends_with(path, ".jsonl"))
    throw Error("results file must end in .csv, .json or .jsonl: " + path);
  const std::string text = read_text(path);
  try {
    return csv ? results_from_csv(text) : results_from_json(text);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());  // which of several inputs is malformed
  }
}

void write_results(const std::string& path, const std::vector<ResultRow>& rows) {
  std::string text;
  if (ends_with(path, ".csv")) {
    text = results_to_csv(rows);
  } else if (ends_with(path, ".json")) {
    text = results_to_json(rows);
  } else {
    throw Error("results file must end in .csv or .json: " + path);
  }
  write_file_atomic(path, text);
}

std::vector<LeaderboardEntry> leaderboard(const std::vector<ResultRow>& rows, LeaderboardOrder order) {
  const std::vector<std::string> columns = task_columns(rows);
  std::map<std::tuple<std::string, std::string, double>, std::map<std::string, const ResultRow*>> groups;
  for (const auto& r : rows) {
    auto& tasks = groups[{r.press, r.setting_kind, r.setting}];
    if (!tasks.emplace(r.task, &r).second)
      throw Error("duplicate result for press " + r.press + " (" + setting_label(r.setting_kind, r.setting) +
                  "), task " + r.task);
  }
  std::vector<LeaderboardEntry> out;
  for (const auto& [key, tasks] : groups) {
    LeaderboardEntry e;
    std::tie(e.press, e.setting_kind, e.setting) = key;
    double sum = 0, evicted = 0;
    for (const auto& t : columns) {
      auto it = tasks.find(t);
      if (it == tasks.end()) continue;
      e.tasks.push_back(t);
      e.task_scores.push_back(it->second->score);
      sum += it->second->score;
      evicted += it->second->evicted_fraction * (double)it->second->n;
      e.n += it->second->n;
    }
    e.average = e.tasks.empty() ? 0 : sum / (double)e.tasks.size();
    if (e.n > 0) {
      e.evicted_fraction = evicted / (double)e.n;
    } else {  // no sample counts recorded: plain mean
      double plain = 0;
      for (const auto& t : e.tasks) plain += tasks.at(t)->evicted_fraction;
      e.evicted_fraction = e.tasks.empty() ? 0 : plain / (double)e.tasks.size();
    }
    out.push_back(std::move(e));
  }
  auto by_press = [](const LeaderboardEntry& a, const LeaderboardEntry& b) {
    return std::tie(a.press, a.setting_kind, a.setting) < std::tie(b.press, b.setting_kind, b.setting);
  };
  if (order == LeaderboardOrder::ByAverage) {
    std::stable_sort(out.begin(), out.end(), [&](const LeaderboardEntry& a, const LeaderboardEntry& b) {
      if (a.average != b.average) return a.average > b.average;
      if (a.evicted_fraction != b.evicted_fraction) return a.evicted_fraction < b.evicted_fraction;
      return by_press(a, b);
    });
  } else {
    std::stable_sort(out.begin(), out.end(), by_press);
  }
  return out;
}

std::string leaderboard_markdown(const std::vector<ResultRow>& rows, LeaderboardOrder order, const std::string& title) {
  const std::vector<std::string> columns = task_columns(rows);
  const auto entries = leaderboard(rows, order);
  std::string out;
  if (!title.empty()) out += "# " + title + "\n\n";
  out += "| Press | Setting | Evicted | Average |";
  for (const auto& t : columns) out += " " + md_escape(t) + " |";
  out += "\n|---|---|---:|---:|";
  for (size_t i = 0; i < columns.size(); ++i) out += "---:|";
  out += "\n";
  bool any_partial = false;
  for (const auto& e : entries) {
    const bool partial = e.tasks.size() < columns.size();
    any_partial |= partial;
    out += "| " + md_escape(e.press) + " | " + setting_label(e.setting_kind, e.setting) + " | " +
           fixed(e.evicted_fraction, 3) + " | " + fixed(e.average, 2) + (partial ? "*" : "") + " |";
    for (const auto& t : columns) {
      auto it = std::find(e.tasks.begin(), e.tasks.end(), t);
      if (it == e.tasks.end()) {
        out += " - |";
      } else {
        out += ' ';
        out += fixed(e.task_scores[(size_t)(it - e.tasks.begin())], 2);
        out += " |";
      }
    }
    out += "\n";
  }
  if (any_partial) out += "\n\\* average over the tasks present only.\n";
  return out;
}

std::string score_plot_svg(const std::vector<ResultRow>& rows, const std::string& task, const PlotOptions& opt) {
  struct Point {
    double x, y, setting;
  };
  // Points per press (press names sorted so colours agree across plots).
  std::map<std::string, std::vector<Point>> curves;
  std::set<std::string> all_presses;
  for (const auto& r : rows) all_presses.insert(r.press);
  if (task == "average") {
    for (const auto& e : leaderboard(rows, LeaderboardOrder::ByPress))
      curves[e.press].push_back({e.evicted_fraction, e.average, e.setting});
  } else {
    for (const auto& r : rows)
      if (r.task == task) curves[r.press].push_back({r.evicted_fraction, r.score, r.setting});
  }
  std::optional<double> baseline;
  if (auto it = curves.find(opt.baseline_press); it != curves.end()) {
    double sum = 0;
    for (const auto& p : it->second) sum += p.y;
    baseline = sum / (double)it->second.size();
    curves.erase(it);
  }
  for (auto& [press, pts] : curves)
    std::stable_sort(pts.begin(), pts.end(), [](const Point& a, const Point& b) {
      return a.x != b.x ? a.x < b.x : a.setting < b.setting;
    });

  double y_max_data = baseline.value_or(0);
  for (const auto& [press, pts] : curves)
    for (const auto& p : pts) y_max_data = std::max(y_max_data, p.y);
  const double y_step = nice_step(std::max(y_max_data, 10.0) / 5.0);
  const double y_max = std::max(y_step, std::ceil(y_max_data / y_step - 1e-9) * y_step);

  const double W = opt.width, H = opt.height;
  const double left = 64, right = 200, top = 48, bottom = 56;
  const double pw = W - left - right, ph = H - top - bottom;
  auto X = [&](double x) { return left + std::clamp(x, 0.0, 1.0) * pw; };
  auto Y = [&](double y) { return top + ph - std::clamp(y / y_max, 0.0, 1.0) * ph; };
  auto num = [](double v) { return fixed(v, 2); };

  std::string s;
  s += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W) + "\" height=\"" + num(H) + "\" viewBox=\"0 0 " +
       num(W) + " " + num(H) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect x=\"0\" y=\"0\" width=\"" + num(W) + "\" height=\"" + num(H) + "\" fill=\"white\"/>\n";
  const std::string title = opt.title.empty() ? task + ": score vs evicted fraction" : opt.title;
  s += "<text x=\"" + num(left + pw / 2) + "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">" + xml_escape(title) +
       "</text>\n";

  // Grid and ticks.
  s += "<g stroke=\"#dddddd\" stroke-width=\"1\">\n";
  for (int i = 0; i <= 5; ++i) {
    const double x = X(i / 5.0);
    s += "<line x1=\"" + num(x) + "\" y1=\"" + num(top) + "\" x2=\"" + num(x) + "\" y2=\"" + num(top + ph) + "\"/>\n";
  }
  const int y_ticks = (int)std::lround(y_max / y_step);
  for (int i = 0; i <= y_ticks; ++i) {
    const double y = Y(i * y_step);
    s += "<line x1=\"" + num(left) + "\" y1=\"" + num(y) + "\" x2=\"" + num(left + pw) + "\" y2=\"" + num(y) + "\"/>\n";
  }
  s += "</g>\n";
  s += "<g stroke=\"black\" stroke-width=\"1\">\n";
  s += "<line x1=\"" + num(left) + "\" y1=\"" + num(top + ph) + "\" x2=\"" + num(left + pw) + "\" y2=\"" + num(top + ph) +
       "\"/>\n";
  s += "<line x1=\"" + num(left) + "\" y1=\"" + num(top) + "\" x2=\"" + num(left) + "\" y2=\"" + num(top + ph) + "\"/>\n";
  for (int i = 0; i <= 5; ++i)
    s += "<line x1=\"" + num(X(i / 5.0)) + "\" y1=\"" + num(top + ph) + "\" x2=\"" + num(X(i / 5.0)) + "\" y2=\"" +
         num(top + ph + 5) + "\"/>\n";
  for (int i = 0; i <= y_ticks; ++i)
    s += "<line x1=\"" + num(left - 5) + "\" y1=\"" + num(Y(i * y_step)) + "\" x2=\"" + num(left) + "\" y2=\"" +
         num(Y(i * y_step)) + "\"/>\n";
  s += "</g>\n";
  s += "<g>\n";
  for (int i = 0; i <= 5; ++i)
    s += "<text x=\"" + num(X(i / 5.0)) + "\" y=\"" + num(top + ph + 19) + "\" text-anchor=\"middle\">" +
         fixed(i / 5.0, 1) + "</text>\n";
  for (int i = 0; i <= y_ticks; ++i)
    s += "<text x=\"" + num(left - 8) + "\" y=\"" + num(Y(i * y_step) + 4) + "\" text-anchor=\"end\">" +
         shortest(i * y_step) + "</text>\n";
  s += "</g>\n";
  s += "<text x=\"" + num(left + pw / 2) + "\" y=\"" + num(H - 14) +
       "\" text-anchor=\"middle\">evicted fraction of context KV entries</text>\n";
  s += "<text x=\"16\" y=\"" + num(top + ph / 2) + "\" text-anchor=\"middle\" transform=\"rotate(-90 16 " +
       num(top + ph / 2) + ")\">score</text>\n";

  // Curves, then the legend.
  double legend_y = top + 8;
  const double legend_x = left + pw + 16;
  auto legend_item = [&](const std::string& colour, const std::string& dash, const std::string& label) {
    s += "<line x1=\"" + num(legend_x) + "\" y1=\"" + num(legend_y) + "\" x2=\"" + num(legend_x + 24) + "\" y2=\"" +
         num(legend_y) + "\" stroke=\"" + colour + "\" stroke-width=\"2\"" + dash + "/>\n";
    s += "<text x=\"" + num(legend_x + 30) + "\" y=\"" + num(legend_y + 4) + "\">" + xml_escape(label) + "</text>\n";
    legend_y += 20;
  };
  if (baseline) {
    s += "<line x1=\"" + num(left) + "\" y1=\"" + num(Y(*baseline)) + "\" x2=\"" + num(left + pw) + "\" y2=\"" +
         num(Y(*baseline)) + "\" stroke=\"black\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n";
  }
  std::vector<std::pair<std::string, std::string>> legend;  // press, colour
  for (const auto& [press, pts] : curves) {
    const size_t idx = (size_t)std::distance(all_presses.begin(), all_presses.find(press));
    const std::string colour = kPalette[idx % std::size(kPalette)];
    std::string points;
    for (const auto& p : pts) {
      if (!points.empty()) points += ' ';
      points += num(X(p.x));
      points += ',';
      points += num(Y(p.y));
    }
    s += "<polyline fill=\"none\" stroke=\"" + colour + "\" stroke-width=\"2\" points=\"" + points + "\"/>\n";
    for (const auto& p : pts)
      s += "<circle cx=\"" + num(X(p.x)) + "\" cy=\"" + num(Y(p.y)) + "\" r=\"3\" fill=\"" + colour + "\"/>\n";
    legend.emplace_back(press, colour);
  }
  if (baseline) legend_item("black", " stroke-dasharray=\"6 4\"", opt.baseline_press + " (" + fixed(*baseline, 1) + ")");
  for (const auto& [press, colour] : legend) legend_item(colour, "", press);
  s += "</svg>\n";
  return s;
}

std::vector<std::string> write_report(const std::vector<ResultRow>& rows, const std::string& out_dir,
                                      const std::string& title) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(fs::path(out_dir) / "plots", ec);
  if (ec) throw Error("cannot create report folder " + out_dir + ": " + ec.message());
  std::vector<std::string> written;
  auto write = [&](const fs::path& path, const std::string& text) {
    write_file_atomic(path.string(), text);
    written.push_back(path.string());
  };
  write(fs::path(out_dir) / "leaderboard.md", leaderboard_markdown(rows, LeaderboardOrder::ByAverage, title));
  PlotOptions avg;
  avg.title = (title.empty() ? std::string() : title + " - ") + "average score vs evicted fraction";
  write(fs::path(out_dir) / "plots" / "average.svg", score_plot_svg(rows, "average", avg));
  for (const auto& task : task_columns(rows)) {
    PlotOptions po;
    po.title = (title.empty() ? std::string() : title + " - ") + task + ": score vs evicted fraction";
    write(fs::path(out_dir) / "plots" / (file_safe(task) + ".svg"), score_plot_svg(rows, task, po));
  }
  return written;
}

}  // namespace kvzap::eval
