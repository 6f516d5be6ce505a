// The model config a checkpoint carries: config.json beside safetensors, or GGUF metadata
// ({arch}.attention.q_lora_rank etc.). Apart from the loader so that `--model FILE` and the fuzz
// targets need only the readers.
#pragma once
#include <string>

#include "harness/model/config.h"

namespace mla {

class Bytes;
struct GgufHeader;

// A path --model / --weights can name as a checkpoint (a .gguf, a .safetensors, a directory of them).
bool is_checkpoint_path(const std::string& path);
// config.json beside a safetensors file / in its directory, or GGUF metadata. Throws UsageError.
MlaConfig checkpoint_config(const std::string& path);
// Where the config.json of a safetensors checkpoint path is.
std::string safetensors_config_path(const std::string& path);
// MLA config from GGUF metadata; the file's origin names it in errors.
MlaConfig config_from_gguf(const Bytes& file, const GgufHeader& h);

}  // namespace mla
