// mlsl_sim: reads a simulation config (training.h: ParseConfig) from the file named by the
// first argument, or stdin, plays it (RunTraining) and prints the result as one JSON line.
#include <fstream>
#include <iostream>

#include "training.h"

int main(int argc, char** argv) {
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
