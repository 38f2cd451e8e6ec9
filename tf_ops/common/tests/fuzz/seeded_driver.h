// The seeded random-bytes driver shared by the fuzz targets, for builds
// without libFuzzer (-DTFRING_SEEDED_DRIVER): mutates valid inputs from
// `seeds` with `mutate`, keeps some mutants so later rounds drift further
// from valid frames, and feeds each to LLVMFuzzerTestOneInput. A crash is a
// crash of this process; a clean end prints "executions N crashes 0".
//
//   TARGET SEED ITERATIONS [SECONDS]   (SECONDS > 0: run that long instead)
#ifndef TFRING_COMMON_TESTS_FUZZ_SEEDED_DRIVER_H
#define TFRING_COMMON_TESTS_FUZZ_SEEDED_DRIVER_H

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

inline int RunSeededDriver(int argc, char** argv, std::vector<std::string> corpus,
                           void (*mutate)(std::string*, std::mt19937_64&)) {
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  const uint64_t iterations = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 100000;
  const double seconds = argc > 3 ? std::atof(argv[3]) : 0;
  // The seeds themselves are never replaced, only mutants.
  const size_t kept = corpus.size();
  std::mt19937_64 rng(seed);
  const auto start = std::chrono::steady_clock::now();
  uint64_t runs = 0;
  for (;; ++runs) {
    if (seconds > 0) {
      auto elapsed = std::chrono::steady_clock::now() - start;
      if ((runs & 1023) == 0 && std::chrono::duration<double>(elapsed).count() >= seconds) break;
    } else if (runs >= iterations) {
      break;
    }
    std::string input = corpus[rng() % corpus.size()];
    mutate(&input, rng);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
    if (rng() % 64 == 0) {
      if (corpus.size() < 256) {
        corpus.push_back(input);
      } else {
        corpus[kept + rng() % (corpus.size() - kept)] = input;
      }
    }
  }
  std::printf("executions %llu crashes 0\n", static_cast<unsigned long long>(runs));
  return 0;
}

#endif  // TFRING_COMMON_TESTS_FUZZ_SEEDED_DRIVER_H
