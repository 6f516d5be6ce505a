// The model config a checkpoint carries: config.json beside safetensors, or GGUF metadata
// ({arch}.attention.q_lora_rank etc.). Apart from the loader so that `--model FILE` and the fuzz
// targets need only the readers.
#pragma once
#include <string>

#include "core/model/config.h"

namespace mla {

class Bytes;
struct GgufHeader;

// A path --model / --weights can name as a checkpoint (a .gguf, a .safetensors, a directory of them).
bool is_checkpoint_path(const std::string& path);
// config.json beside a safetensors file / in its directory, or GGUF metadata. Throws UsageError.
MlaConfig checkpoint_config(const std::string& path);
// Where the config.json of a safetensors checkpoint path is.
std::string safetensors_config_path(const std::string& path);
// MLA config from GGUF metadata; the file's origin names it in errors. Warns (stderr, once per file) about keys of
// the architecture's own namespace that it does not know: a key whose name was damaged (one flipped byte in
// rope.scaling.type) would otherwise be read as absent, silently turning YaRN off.
MlaConfig config_from_gguf(const Bytes& file, const GgufHeader& h);
// Warns (stderr, once per file) about fields of an HF config.json that look like rope or attention settings (names
// holding rope, attn, attention, scaling, window or head) but are not read, and about unknown keys inside
// rope_scaling / rope_parameters: what they would change is not modelled. `text` is valid JSON (parsed before).
void warn_unknown_config_fields(const std::string& text, const std::string& origin);

// `--model`: a preset name, a path to config.json (or a directory holding one), or a checkpoint file
// (checkpoint_config).
MlaConfig load_model_config(const std::string& spec);

}  // namespace mla
