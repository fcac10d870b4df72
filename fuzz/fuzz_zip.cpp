// Zip reader (the wheel `kvzap pull` unpacks): central directory, ZIP64, local headers, stored and
// deflated members with size and CRC checks. Every member is extracted (bounded by -malloc_limit_mb).
#include <cstdint>

#include "format/zip.h"
#include "fuzz_common.h"
#include "kvzap/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvzap;
  const std::string path = fuzz::write_file("input.zip", data, size);
  try {
    const auto a = zip::Archive::open(path);
    for (const zip::Entry& e : a->entries()) {
      (void)a->find(e.name);
      uint64_t total = 0;
      try {
        // Stop a member that inflates far past the input (a zip bomb is not a reader bug).
        a->extract(e, [&](const uint8_t* p, size_t n) {
          total += n;
          if (n) (void)p[n - 1];
          if (total > (64u << 20)) throw Error("fuzz: member too large");
        });
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
