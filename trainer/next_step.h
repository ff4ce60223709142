#ifndef TESSERA_TRAINER_NEXT_STEP_H_
#define TESSERA_TRAINER_NEXT_STEP_H_

#include <string>

#include "absl/status/status.h"

namespace tessera::trainer {

// What to do after failure `s` ends a training run, where its message does not say so
// already ("" then): chosen by its code and its cause (tessera::CauseOf: a data-parallel
// partner, a damaged input file), never by its words. `checkpoints`: the run takes
// checkpoints or resumed from one (the advice then ends in --resume=auto); `model`: the
// run's --model, for a restore.
std::string NextStepAfter(const absl::Status& s, bool checkpoints, const std::string& model);

}  // namespace tessera::trainer

#endif  // TESSERA_TRAINER_NEXT_STEP_H_
