// mlsl_sim: reads a simulation config (training.h: ParseConfig) from the file named by the
// first argument, or stdin, plays it (RunTraining) and prints the result as one JSON line.
//   mlsl_sim [CONFIG]                 simulate training
//   mlsl_sim --cost BYTES... < CONFIG the fabric's allreduce cost of each size, one JSON line each
//   mlsl_sim --requests [CONFIG]      the config's requests (requests.h): one JSON line per completion
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>

#include "../meta.h"
#include "requests.h"
#include "training.h"

namespace {

int Costs(int argc, char** argv) {
  mlsl::SimConfig config;
  std::string error;
  if (!mlsl::ParseConfig(std::cin, &config, &error, /*layers=*/false)) {
    std::cerr << "mlsl_sim: " << error << "\n";
    return 1;
  }
  for (int i = 2; i < argc; ++i) {
    const int64_t bytes = std::atoll(argv[i]);
    const mlsl::SimCost c = mlsl::AllreduceCost(config.fabric, bytes);
    std::cout << "{\"bytes\": " << bytes << ", \"algorithm\": \"" << mlsl::AllreduceAlgorithm(config.fabric, bytes)
              << "\", \"latency_s\": " << c.latency << ", \"link_s\": " << c.link << "}" << std::endl;
  }
  return 0;
}

int Requests(int argc, char** argv) {
  mlsl::SimConfig config;
  std::string error;
  std::ifstream file;
  if (argc > 2) file.open(argv[2]);
  if (argc > 2 && !file) {
    std::cerr << "mlsl_sim: cannot open " << argv[2] << "\n";
    return 2;
  }
  std::vector<mlsl::SimCompletion> done;
  bool ok = mlsl::ParseConfig(argc > 2 ? file : std::cin, &config, &error, /*layers=*/false) &&
            mlsl::RunRequests(config, &done, &error);
  if (!ok) {
    std::cerr << "mlsl_sim: " << error << "\n";
    return 1;
  }
  for (const mlsl::SimCompletion& c : done) {
    std::cout << "{\"round\": " << c.round << ", \"name\": \"" << mlsl::JsonEscape(c.name)
              << "\", \"done_s\": " << c.done_s << "}" << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::cout.precision(12);
  if (argc > 1 && std::strcmp(argv[1], "--cost") == 0) return Costs(argc, argv);
  if (argc > 1 && std::strcmp(argv[1], "--requests") == 0) return Requests(argc, argv);
  mlsl::SimConfig config;
  std::string error;
  bool ok;
  if (argc > 1) {
    std::ifstream in(argv[1]);
    if (!in) {
      std::cerr << "mlsl_sim: cannot open " << argv[1] << "\n";
      return 2;
    }
    ok = mlsl::ParseConfig(in, &config, &error);
  } else {
    ok = mlsl::ParseConfig(std::cin, &config, &error);
  }
  mlsl::SimResult result;
  if (ok) ok = mlsl::RunTraining(config, &result, &error);
  if (!ok) {
    std::cerr << "mlsl_sim: " << error << "\n";
    return 1;
  }
  std::cout << mlsl::ResultJson(config, result) << std::endl;
  return 0;
}
