// Result files, leaderboard and SVG plots.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "eval/report.h"
#include "kvzap/error.h"

using namespace kvzap;
using namespace kvzap::eval;

namespace {

std::vector<ResultRow> sample_rows() {
  std::vector<ResultRow> rows;
  auto add = [&](const std::string& press, const std::string& kind, double setting, double evicted,
                 double s1, double s2) {
    rows.push_back({press, kind, setting, "niah_single_1", 10, s1, evicted});
    rows.push_back({press, kind, setting, "qa_1", 20, s2, evicted + 0.01});
  };
  add("no_press", "none", 0, 0.0, 100, 80);
  add("kvzap_mlp", "threshold", -4, 0.6, 95, 70);
  add("kvzap_mlp", "threshold", -6, 0.3, 99, 78);
  add("snapkv", "ratio", 0.5, 0.5, 60, 40);
  add("snapkv", "ratio", 0.75, 0.75, 30, 10);
  add("random", "ratio", 0.5, 0.5, 20, 35);
  return rows;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Minimal XML well-formedness check: every element closes in order, attribute values are quoted,
// and nothing but the declaration and one <svg> root sits at top level.
::testing::AssertionResult well_formed_svg(const std::string& s) {
  std::vector<std::string> stack;
  size_t i = 0, roots = 0;
  while ((i = s.find('<', i)) != std::string::npos) {
    const size_t end = s.find('>', i);
    if (end == std::string::npos) return ::testing::AssertionFailure() << "unterminated tag at " << i;
    std::string tag = s.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.rfind("?xml", 0) == 0) continue;
    if (tag.rfind("!--", 0) == 0) continue;
    if (!tag.empty() && tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (stack.empty() || stack.back() != name)
        return ::testing::AssertionFailure() << "unexpected </" << name << ">";
      stack.pop_back();
      continue;
    }
    const bool self_closing = !tag.empty() && tag.back() == '/';
    if (self_closing) tag.pop_back();
    const std::string name = tag.substr(0, tag.find_first_of(" \n\t"));
    if (name.empty()) return ::testing::AssertionFailure() << "empty tag name";
    // Attributes: name="value" pairs only.
    static const std::regex attrs(R"(^[A-Za-z:][\w:.-]*(\s+[A-Za-z:][\w:.-]*="[^"<>]*")*\s*$)");
    if (!std::regex_match(tag, attrs)) return ::testing::AssertionFailure() << "bad attributes in <" << tag << ">";
    if (stack.empty()) ++roots;
    if (!self_closing) stack.push_back(name);
  }
  if (!stack.empty()) return ::testing::AssertionFailure() << "unclosed <" << stack.back() << ">";
  if (roots != 1) return ::testing::AssertionFailure() << roots << " root elements";
  return ::testing::AssertionSuccess();
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

}  // namespace

TEST(EvalReport, CsvRoundTripIsExact) {
  auto rows = sample_rows();
  rows.push_back({"odd, \"name\"", "ratio", 0.1 + 0.2, "custom task", 3, 100.0 / 3.0, 1.0 / 7.0});
  const std::string csv = results_to_csv(rows);
  EXPECT_EQ(csv.substr(0, csv.find('\n')), "press,setting_kind,setting,task,n,score,evicted_fraction");
  EXPECT_NE(csv.find("\"odd, \"\"name\"\"\""), std::string::npos) << "RFC 4180 quoting";
  const auto back = results_from_csv(csv);
  ASSERT_EQ(back.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(back[i].press, rows[i].press);
    EXPECT_EQ(back[i].setting_kind, rows[i].setting_kind);
    EXPECT_EQ(back[i].setting, rows[i].setting);  // bit-exact
    EXPECT_EQ(back[i].task, rows[i].task);
    EXPECT_EQ(back[i].n, rows[i].n);
    EXPECT_EQ(back[i].score, rows[i].score);
    EXPECT_EQ(back[i].evicted_fraction, rows[i].evicted_fraction);
  }
  // Columns are matched by name; CRLF line ends and extra columns are fine.
  const auto reordered = results_from_csv(
      "task,score,press,n,evicted_fraction,setting_kind,setting,note\r\nvt,12.5,knorm,4,0.25,ratio,0.25,x\r\n");
  ASSERT_EQ(reordered.size(), 1u);
  EXPECT_EQ(reordered[0].press, "knorm");
  EXPECT_EQ(reordered[0].score, 12.5);
  EXPECT_EQ(reordered[0].n, 4);
}

TEST(EvalReport, CsvErrorsNameTheProblem) {
  try {
    results_from_csv("press,setting_kind,setting,task,n,score\nx,ratio,0.5,vt,1,2\n");
    FAIL() << "missing column accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("evicted_fraction"), std::string::npos);
  }
  try {
    results_from_csv("press,setting_kind,setting,task,n,score,evicted_fraction\nx,ratio,0.5,vt,1,2,0\n"
                     "y,ratio,half,vt,1,2,0\n");
    FAIL() << "bad number accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(results_from_csv("press,setting_kind,setting,task,n,score,evicted_fraction\nx,fixed,0.5,vt,1,2,0\n"),
               Error);
  EXPECT_THROW(results_from_csv(""), Error);
  EXPECT_THROW(read_results("/nonexistent/results.csv"), Error);
  EXPECT_THROW(read_results("results.txt"), Error);
}

// The message of the kvzap::Error that results_from_csv throws for `text` ("" if none).
std::string csv_error(const std::string& text) {
  try {
    results_from_csv(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* const kHeader = "press,setting_kind,setting,task,n,score,evicted_fraction\n";

TEST(EvalReport, CsvQuotedFieldsRoundTrip) {
  // Plain fields stay bare: the file is byte for byte what it always was.
  EXPECT_EQ(results_to_csv({{"snapkv", "ratio", 0.5, "vt", 4, 12.5, 0.25}}),
            std::string(kHeader) + "snapkv,ratio,0.5,vt,4,12.5,0.25\n");
  // Commas, quotes, CR/LF and LF line breaks inside fields, and blanks at either end.
  const std::vector<ResultRow> rows = {
      {"a,b", "ratio", 0.5, "say \"hi\"", 1, 1, 0.5},
      {"two\nlines", "threshold", -3, "crlf\r\ninside", 2, 2, 0.25},
      {" padded\t", "none", 0, "\"\"", 3, 3, 0},
      {"plain", "ratio", 0.25, ",", 4, 4, 0.125},
  };
  const std::string csv = results_to_csv(rows);
  EXPECT_NE(csv.find("\"a,b\",ratio,0.5,\"say \"\"hi\"\"\""), std::string::npos) << csv;
  EXPECT_NE(csv.find("\"two\nlines\""), std::string::npos) << csv;
  EXPECT_NE(csv.find("\" padded\t\""), std::string::npos) << csv;
  EXPECT_NE(csv.find(",\"\"\"\"\"\","), std::string::npos) << csv;
  const auto back = results_from_csv(csv);
  ASSERT_EQ(back.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(back[i].press, rows[i].press) << i;
    EXPECT_EQ(back[i].task, rows[i].task) << i;
    EXPECT_EQ(back[i].n, rows[i].n) << i;
    EXPECT_EQ(back[i].setting, rows[i].setting) << i;
  }
  // Hand-written: quoted numbers, blank lines, no final line break, unquoted blanks kept.
  const auto hand = results_from_csv(std::string(kHeader) + "\n\"x\",\"ratio\",\"0.5\",vt,\"7\",1,0\r\n\r\n\n" +
                                     "y ,none,0,vt,1,2,0");
  ASSERT_EQ(hand.size(), 2u);
  EXPECT_EQ(hand[0].press, "x");
  EXPECT_EQ(hand[0].setting, 0.5);
  EXPECT_EQ(hand[0].n, 7);
  EXPECT_EQ(hand[1].press, "y ");
  EXPECT_EQ(hand[1].score, 2);
}

TEST(EvalReport, CsvMalformedInputNamesTheLine) {
  const std::string h = kHeader;
  // A wrong field count, on line 3 (after a blank line).
  EXPECT_NE(csv_error(h + "\nx,ratio,0.5,vt,1,2\n").find("line 3: expected 7 fields, found 6"), std::string::npos)
      << csv_error(h + "\nx,ratio,0.5,vt,1,2\n");
  // Line numbers count the line breaks inside quoted fields: the bad row starts on line 5.
  const std::string multi = h + "\"a\nb\nc\",ratio,0.5,vt,1,2,0\nz,ratio,0.5,vt,1,2,0,extra\n";
  EXPECT_NE(csv_error(multi).find("line 5:"), std::string::npos) << csv_error(multi);
  const std::string bad_number = h + "\"a\nb\",ratio,0.5,vt,1,2,0\nz,ratio,0.5,vt,one,2,0\n";
  EXPECT_NE(csv_error(bad_number).find("line 4: column n is not an integer: 'one'"), std::string::npos)
      << csv_error(bad_number);
  // A bad row that itself spans lines 2-3 is named by the line it starts on.
  const std::string spans = h + "\"a\nb\",ratio,0.5,vt,1,2,zero\n";
  EXPECT_NE(csv_error(spans).find("line 2: column evicted_fraction"), std::string::npos) << csv_error(spans);
  EXPECT_NE(csv_error(h + "x,ratio,0.5,vt,1,2,0.5x\n").find("line 2: column evicted_fraction is not a number"),
            std::string::npos);
  // An unterminated quote names the line where the field opens, not the end of the text.
  const std::string open_quote = h + "x,ratio,0.5,vt,1,2,0\n\ny,ratio,0.5,\"vt,1,2,0\nmore\n\n";
  EXPECT_NE(csv_error(open_quote).find("line 4: unterminated quoted field"), std::string::npos)
      << csv_error(open_quote);
  const std::string open_late = h + "\"a\nb\",ratio,0.5,\"vt\nz,1,2,0\n";
  EXPECT_NE(csv_error(open_late).find("line 3: unterminated quoted field"), std::string::npos)
      << csv_error(open_late);
  // A quote inside an unquoted field, and text after a closing quote.
  const std::string stray = h + "x,ratio,0.5,vt,1,2,0\nx\"y,ratio,0.5,vt,1,2,0\n";
  EXPECT_NE(csv_error(stray).find("line 3: malformed quoting"), std::string::npos) << csv_error(stray);
  const std::string after = h + "\"x\"y,ratio,0.5,vt,1,2,0\n";
  EXPECT_NE(csv_error(after).find("line 2: malformed quoting"), std::string::npos) << csv_error(after);
  // A header alone is an empty result, not an error; blank text is an error.
  EXPECT_TRUE(results_from_csv(h).empty());
  EXPECT_NE(csv_error("\n\r\n").find("empty"), std::string::npos);
  // From a file, the message names the file too.
  const std::string path = testing::TempDir() + "/kvzap_bad_results.csv";
  std::ofstream(path) << after;
  try {
    read_results(path);
    FAIL() << "malformed file accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": CSV line 2: malformed quoting"), std::string::npos) << e.what();
  }
}

TEST(EvalReport, JsonAndFileRoundTrip) {
  const auto rows = sample_rows();
  const auto back = results_from_json(results_to_json(rows));
  ASSERT_EQ(back.size(), rows.size());
  EXPECT_EQ(results_to_csv(back), results_to_csv(rows));
  const auto lines = results_from_json(
      "{\"press\":\"a\",\"setting_kind\":\"none\",\"setting\":0,\"task\":\"vt\",\"n\":2,\"score\":50,"
      "\"evicted_fraction\":0}\n\n");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].score, 50);
  const std::string dir = testing::TempDir();
  write_results(dir + "/kvzap_results.csv", rows);
  write_results(dir + "/kvzap_results.json", rows);
  EXPECT_EQ(results_to_csv(read_results(dir + "/kvzap_results.csv")), results_to_csv(rows));
  EXPECT_EQ(results_to_csv(read_results(dir + "/kvzap_results.json")), results_to_csv(rows));
}

TEST(EvalReport, LeaderboardGroupsAndSorts) {
  const auto rows = sample_rows();
  const auto lb = leaderboard(rows);
  ASSERT_EQ(lb.size(), 6u);
  for (size_t i = 1; i < lb.size(); ++i) EXPECT_GE(lb[i - 1].average, lb[i].average) << i;
  EXPECT_EQ(lb[0].press, "no_press");
  EXPECT_DOUBLE_EQ(lb[0].average, 90.0);
  // kvzap at -6: average (99 + 78) / 2; evicted = (10 * 0.3 + 20 * 0.31) / 30.
  EXPECT_EQ(lb[1].press, "kvzap_mlp");
  EXPECT_EQ(lb[1].setting, -6);
  EXPECT_DOUBLE_EQ(lb[1].average, 88.5);
  EXPECT_NEAR(lb[1].evicted_fraction, (10 * 0.3 + 20 * 0.31) / 30.0, 1e-12);
  EXPECT_EQ(lb[1].n, 30);
  // random (27.5) ranks below snapkv 0.5 (50) and above snapkv 0.75 (20).
  EXPECT_EQ(lb.back().press, "snapkv");
  EXPECT_EQ(lb.back().setting, 0.75);
  const auto by_press = leaderboard(rows, LeaderboardOrder::ByPress);
  EXPECT_EQ(by_press[0].press, "kvzap_mlp");
  EXPECT_EQ(by_press[0].setting, -6);  // setting ascending within a press
  EXPECT_EQ(by_press[1].setting, -4);
  auto dup = rows;
  dup.push_back(rows[3]);
  EXPECT_THROW(leaderboard(dup), Error);
}

TEST(EvalReport, LeaderboardMarkdownRowsAreSorted) {
  auto rows = sample_rows();
  rows.push_back({"partial", "ratio", 0.25, "qa_1", 5, 99.0, 0.25});  // no niah_single_1
  const std::string md = leaderboard_markdown(rows, LeaderboardOrder::ByAverage, "RULER 1k");
  EXPECT_EQ(md.rfind("# RULER 1k\n", 0), 0u);
  EXPECT_NE(md.find("| Press | Setting | Evicted | Average | niah_single_1 | qa_1 |"), std::string::npos);
  // Parse the averages column back and check it is non-increasing.
  std::istringstream in(md);
  std::vector<double> averages;
  std::vector<std::string> presses;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| ", 0) != 0 || line.rfind("| Press", 0) == 0) continue;
    std::vector<std::string> cells;
    std::stringstream ls(line.substr(1));
    for (std::string cell; std::getline(ls, cell, '|');) cells.push_back(cell);
    presses.push_back(cells[0]);
    averages.push_back(std::stod(cells[3]));
  }
  ASSERT_EQ(averages.size(), 7u);
  for (size_t i = 1; i < averages.size(); ++i) EXPECT_GE(averages[i - 1], averages[i]);
  EXPECT_EQ(presses[0], " partial ");  // 99 over its only task, flagged as partial
  EXPECT_NE(md.find("| partial | ratio 0.25 | 0.250 | 99.00* | - | 99.00 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| kvzap_mlp | threshold -6 | 0.307 | 88.50 | 99.00 | 78.00 |"), std::string::npos) << md;
  EXPECT_NE(md.find("average over the tasks present only"), std::string::npos);
}

TEST(EvalReport, SvgIsWellFormedWithOnePolylinePerPress) {
  const auto rows = sample_rows();
  for (const std::string task : {"niah_single_1", "qa_1", "average"}) {
    const std::string svg = score_plot_svg(rows, task);
    EXPECT_TRUE(well_formed_svg(svg)) << task;
    EXPECT_EQ(count(svg, "<polyline"), 3u) << "kvzap_mlp, random, snapkv; no_press is the dashed baseline";
    EXPECT_EQ(count(svg, "stroke-dasharray"), 2u) << "baseline line + its legend swatch";
    EXPECT_EQ(count(svg, "<circle"), 5u) << "one marker per point";
    for (const std::string press : {"kvzap_mlp", "random", "snapkv", "no_press"})
      EXPECT_NE(svg.find(">" + press), std::string::npos) << "legend entry " << press;
    EXPECT_NE(svg.find("evicted fraction"), std::string::npos);
    EXPECT_NE(svg.find("<text x="), std::string::npos);
  }
  // Points of a curve are ordered by evicted fraction: kvzap -6 (0.3) before -4 (0.6).
  const std::string svg = score_plot_svg(rows, "niah_single_1");
  const std::regex poly("points=\"([0-9.]+),[0-9.]+ ([0-9.]+),[0-9.]+\"");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, poly));
  EXPECT_LT(std::stod(m[1]), std::stod(m[2]));
  // Hostile press names are escaped.
  std::vector<ResultRow> odd = {{"<a&b>", "ratio", 0.5, "vt", 1, 50, 0.5}};
  const std::string esc = score_plot_svg(odd, "vt");
  EXPECT_TRUE(well_formed_svg(esc));
  EXPECT_NE(esc.find("&lt;a&amp;b&gt;"), std::string::npos);
}

TEST(EvalReport, WriteReportCreatesLeaderboardAndPlots) {
  const std::string dir = testing::TempDir() + "/kvzap_report_test";
  std::filesystem::remove_all(dir);
  const auto files = write_report(sample_rows(), dir, "Test");
  ASSERT_EQ(files.size(), 4u);  // leaderboard + average + 2 tasks
  EXPECT_TRUE(std::filesystem::exists(dir + "/leaderboard.md"));
  for (const char* name : {"average", "niah_single_1", "qa_1"}) {
    const std::string path = dir + "/plots/" + name + ".svg";
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    EXPECT_TRUE(well_formed_svg(slurp(path))) << path;
  }
  EXPECT_NE(slurp(dir + "/leaderboard.md").find("# Test"), std::string::npos);
  std::filesystem::remove_all(dir);
}
