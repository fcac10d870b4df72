// Where the shipped data files (data/: KVzap surrogates, evaluation haystacks) are found at run time.
// 1. $KVZAP_DATA_DIR; 2. set_data_dir() (a front end that knows better); 3. a `data` folder beside the
// shared library or executable holding this code (the installed Python package: site-packages/kvzap/data
// next to libkvzap.so); 4. `../share/kvzap` from that binary (a `cmake --install` prefix); 5. the source
// tree it was built from (KVZAP_SOURCE_DIR/data). Each candidate counts only if it holds `surrogates/`.
#pragma once
#include <string>

namespace kvzap {

std::string data_dir();
void set_data_dir(const std::string& dir);  // "" = back to the automatic choice

}  // namespace kvzap
